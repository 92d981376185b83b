//! A refusal: its status, its kind, the field it names, and its words. Each API shapes
//! it its own way ([`super::api::Api::error_body`]); the kinds are OpenAI's names.

use serde_json::{json, Value};

/// A client error: HTTP status, OpenAI error type, the offending parameter, a message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub message: String,
    /// OpenAI's code for the case, where it names one (`context_length_exceeded`).
    pub code: Option<&'static str>,
    /// Seconds after which the client may try again (sent as `Retry-After`).
    pub retry_after_s: Option<u32>,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            param: None,
            message: message.into(),
            code: None,
            retry_after_s: None,
        }
    }

    pub fn invalid(param: Option<&'static str>, message: impl Into<String>) -> Self {
        Self {
            param,
            ..Self::new(400, "invalid_request_error", message)
        }
    }

    /// `Err` naming `field` when `found` is over `most`: "`what`; this server takes at most
    /// `most`" (every bound on a field that costs the engine work says it so).
    pub fn at_most(
        field: &'static str,
        found: usize,
        most: usize,
        what: impl FnOnce() -> String,
    ) -> Result<(), Self> {
        if found <= most {
            return Ok(());
        }
        let message = format!("{}; this server takes at most {most}", what());
        Err(Self::invalid(Some(field), message))
    }

    /// A failure on the server's side (500).
    pub fn server(message: impl Into<String>) -> Self {
        Self::new(500, "server_error", message)
    }

    /// The server is at its bound on requests in flight (429, try again shortly).
    pub fn busy(message: impl Into<String>) -> Self {
        Self {
            retry_after_s: Some(1),
            ..Self::new(429, "rate_limit_error", message)
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}
