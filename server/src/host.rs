//! The `Host` a keyless server answers to, and the `Origin` it answers: loopback names,
//! and those the operator adds.
//!
//! A browser lets any page send requests to 127.0.0.1 under the page's own name once that
//! name resolves there (DNS rebinding); it always sends the name it used as `Host`. A page
//! of another site that sends to 127.0.0.1 by that name names itself in `Origin` (on every
//! POST): the server serves no page, so no origin but a local one has business with it. A
//! request without `Host` or `Origin` (HTTP/1.0, a program, not a browser) is served.

use axum::http::{header, HeaderMap};

use super::openai::ApiError;

/// `Err` unless `headers`' `Host`, and its `Origin` if it has one, name a loopback name or
/// one of `allowed`.
pub(super) fn check(headers: &HeaderMap, allowed: &[String]) -> Result<(), ApiError> {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        // `scheme://host[:port]`; a sandboxed page or a file sends `null`.
        let host = origin.split_once("://").map_or("", |(_, host)| host);
        let name = name_of(host);
        if !(is_loopback(name) || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))) {
            return Err(ApiError::new(
                403,
                "permission_error",
                format!(
                    "a page of Origin {origin:?} may not use this server without an API key: \
                     start it with a key, or with --api-allowed-host for that page's name"
                ),
            ));
        }
    }
    let Some(host) = headers.get(header::HOST) else {
        return Ok(());
    };
    let host = host.to_str().unwrap_or("");
    let name = name_of(host);
    if is_loopback(name) || allowed.iter().any(|a| a.eq_ignore_ascii_case(name)) {
        return Ok(());
    }
    Err(ApiError::new(
        403,
        "permission_error",
        format!(
            "Host {host:?} is not a name this server answers to without an API key: \
             use 127.0.0.1 or localhost, or start it with --api-allowed-host or a key"
        ),
    ))
}

/// The name part of a `Host` value: without its port, an IPv6 address without brackets
/// (the live page's own Host rule reads names the same way).
pub fn name_of(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

fn is_loopback(name: &str) -> bool {
    let name = name.trim_end_matches('.');
    name.eq_ignore_ascii_case("localhost")
        || name.to_ascii_lowercase().ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_host(host: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        headers
    }

    #[test]
    fn loopback_names_pass_and_others_are_refused() {
        for host in [
            "127.0.0.1",
            "127.0.0.1:8000",
            "localhost:8000",
            "LOCALHOST",
            "[::1]:8000",
            "app.localhost",
            "127.1.2.3",
        ] {
            assert!(check(&with_host(host), &[]).is_ok(), "{host}");
        }
        for host in [
            "attacker.example",
            "attacker.example:8000",
            "localhost.attacker.example",
            "10.0.0.5:8000",
            "[::2]:80",
            "",
        ] {
            let refused = check(&with_host(host), &[]).unwrap_err();
            assert_eq!(refused.status, 403, "{host}");
        }
        assert!(check(&HeaderMap::new(), &[]).is_ok());
        // A page of another site, sending to the loopback name itself: refused by Origin.
        let from = |origin: &str| {
            let mut headers = with_host("127.0.0.1:8000");
            headers.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
            check(&headers, &[])
        };
        assert!(from("http://localhost:3000").is_ok());
        assert!(from("http://127.0.0.1:8000").is_ok());
        for origin in [
            "https://attacker.example",
            "null",
            "http://localhost.attacker.example",
        ] {
            assert_eq!(from(origin).unwrap_err().status, 403, "{origin}");
        }
        let allowed = ["box.lan".to_string()];
        assert!(check(&with_host("Box.lan:8000"), &allowed).is_ok());
        assert!(check(&with_host("other.lan"), &allowed).is_err());
    }
}
