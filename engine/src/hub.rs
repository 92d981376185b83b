//! A GGUF named by its Hugging Face model id: taken from the hub's local cache when it is
//! there, else downloaded into it (`HF_HOME`, `HF_ENDPOINT` and `HF_TOKEN` as the hub's
//! own clients read them). Offline, a model not yet cached fails at once rather than
//! after the client's retries.

use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo};

/// How long the reachability check waits for the hub.
const REACHABLE_WITHIN: Duration = Duration::from_secs(3);

/// The local path of `file` in hub model `repo` (one `.gguf` of the repository, chosen
/// as below, when `file` is `None`), or why not.
pub fn gguf_from_hub(repo: &str, file: Option<&str>) -> Result<PathBuf, String> {
    if let Some(file) = file {
        if let Some(path) = Cache::from_env().repo(Repo::model(repo.into())).get(file) {
            return Ok(path);
        }
    }
    let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
    if !reachable(&endpoint) {
        return Err(format!(
            "the Hugging Face hub ({endpoint}) cannot be reached from here, and the model is \
             not in its local cache: give a local file instead (--llm /path/to/model.gguf)"
        ));
    }
    let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
    let api = ApiBuilder::from_env()
        .with_token(token)
        .with_progress(true)
        .build()
        .map_err(|e| e.to_string())?
        .model(repo.into());
    let file = match file {
        Some(file) => file.to_string(),
        None => {
            let info = api.info().map_err(|e| format!("listing {repo}: {e}"))?;
            let ggufs: Vec<String> = info
                .siblings
                .into_iter()
                .map(|s| s.rfilename)
                .filter(|f| f.ends_with(".gguf"))
                .collect();
            choose_gguf(&ggufs).ok_or_else(|| match ggufs.is_empty() {
                true => format!("{repo} holds no .gguf file"),
                false => format!(
                    "{repo} holds several GGUFs; name one as {repo}:FILE ({})",
                    ggufs.join(", ")
                ),
            })?
        }
    };
    eprintln!("engine: fetching {repo}:{file} from the Hugging Face hub");
    api.get(&file)
        .map_err(|e| format!("fetching {repo}:{file}: {e}"))
}

/// The one GGUF of a repository, or its Q4_K_M (the usual default), if either exists.
fn choose_gguf(files: &[String]) -> Option<String> {
    if let [only] = files {
        return Some(only.clone());
    }
    let q4_k_m: Vec<&String> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().contains("q4_k_m"))
        .collect();
    match q4_k_m[..] {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// Whether a TCP connection to the endpoint's host opens within [`REACHABLE_WITHIN`].
fn reachable(endpoint: &str) -> bool {
    let rest = endpoint.split("://").nth(1).unwrap_or(endpoint);
    let host = rest.split('/').next().unwrap_or(rest);
    let with_port = match (host.contains(':'), endpoint.starts_with("http://")) {
        (true, _) => host.to_string(),
        (false, true) => format!("{host}:80"),
        (false, false) => format!("{host}:443"),
    };
    let Ok(addrs) = with_port.to_socket_addrs() else {
        return false;
    };
    addrs
        .into_iter()
        .any(|addr| TcpStream::connect_timeout(&addr, REACHABLE_WITHIN).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repository_gguf_is_chosen_only_when_it_is_plain_which() {
        let files = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(choose_gguf(&files(&["a.gguf"])), Some("a.gguf".into()));
        assert_eq!(
            choose_gguf(&files(&["m-Q8_0.gguf", "m-Q4_K_M.gguf"])),
            Some("m-Q4_K_M.gguf".into())
        );
        assert_eq!(choose_gguf(&files(&["m-Q8_0.gguf", "m-f16.gguf"])), None);
    }
}
