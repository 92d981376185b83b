//! Who can reach the agents' API: a keyless server listens on loopback only and answers
//! only loopback `Host` names; an empty key is refused; the key never shows in `--help`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `program` with `args` and a clean API key variable, run to its end; a program still
/// running after a minute (it started serving) is killed and fails the test.
fn run(program: &str, args: &[&str], key_var: Option<&str>) -> Output {
    let mut command = Command::new(program);
    command
        .args(args)
        .env("LIVEKIT_URL", "ws://127.0.0.1:9")
        .env("LIVEKIT_API_KEY", "devkey")
        .env("LIVEKIT_API_SECRET", "secret-secret-secret-secret-secret")
        .env_remove("SUBLET_API_KEY");
    if let Some(key) = key_var {
        command.env("SUBLET_API_KEY", key);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{program} {args:?} was still running after 60 s: it was not refused");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

fn refused(output: &Output) -> String {
    assert!(!output.status.success(), "started: {output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn an_api_open_to_the_network_needs_a_key_and_an_empty_key_is_refused() {
    let serve = env!("CARGO_BIN_EXE_serve");
    let started = Instant::now();
    let stderr = refused(&run(serve, &["--addr", "0.0.0.0:0"], None));
    assert!(
        stderr.contains("--addr 0.0.0.0:0") && stderr.contains("--api-key"),
        "{stderr}"
    );
    let stderr = refused(&run(serve, &["--api-key", ""], None));
    assert!(stderr.contains("--api-key is empty"), "{stderr}");
    let stderr = refused(&run(serve, &[], Some("")));
    assert!(stderr.contains("--api-key is empty"), "{stderr}");
    let worker = env!("CARGO_BIN_EXE_worker");
    let stderr = refused(&run(worker, &["--api", "0.0.0.0:0"], None));
    assert!(
        stderr.contains("--api 0.0.0.0:0") && stderr.contains("--api-key"),
        "{stderr}"
    );
    // Refused at start, before any model loads.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn help_never_prints_the_key() {
    for program in [env!("CARGO_BIN_EXE_serve"), env!("CARGO_BIN_EXE_worker")] {
        let output = run(program, &["--help"], Some("s3cret-key-value"));
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(help.contains("SUBLET_API_KEY"), "{help}");
        assert!(!help.contains("s3cret-key-value"), "{program}: {help}");
    }
}

/// The server, killed when dropped.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET /v1/models` on `port` naming `host`, as HTTP/1.1: the status code.
fn models_status(port: u16, host: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let request = format!("GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    reply.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn a_keyless_server_answers_only_loopback_host_names() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_serve"))
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .args(["--api-allowed-host", "box.lan"])
        .env_remove("SUBLET_API_KEY")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _served = Served(child);
    let started = Instant::now();
    while models_status(port, "127.0.0.1").is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "serve never came up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for host in ["127.0.0.1", &format!("localhost:{port}"), "box.lan"] {
        assert_eq!(models_status(port, host), Some(200), "{host}");
    }
    for host in [
        "attacker.example",
        &format!("attacker.example:{port}"),
        "10.1.2.3",
    ] {
        assert_eq!(models_status(port, host), Some(403), "{host}");
    }
}
