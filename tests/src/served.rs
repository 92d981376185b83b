//! A server process a test owns (killed when the test ends, its stderr echoed, its end
//! reported when it crashes), and the port it listens on.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A child process the test owns: killed when dropped, its stderr echoed, and its exit
/// status printed if it ends on its own (a signal names a crash the child could not report).
pub struct Server {
    child: Arc<Mutex<Child>>,
    /// Set when the test kills the child, whose end then needs no report.
    killing: Arc<AtomicBool>,
}

impl Server {
    /// The `serve` binary at `bin` on a port of its own with the key `key` and `more`
    /// arguments, once it answers `/health`; the port.
    pub fn serve(bin: &str, key: &str, more: &[&str]) -> (Self, u16) {
        let port = free_port();
        let child = std::process::Command::new(bin)
            .args(["--addr", &format!("127.0.0.1:{port}"), "--api-key", key])
            .args(more)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("serve starts");
        let server = Self::watched("serve", child);
        server.wait_healthy(port);
        (server, port)
    }

    /// Owns `child` (killed when dropped) and echoes its stderr after `label`.
    pub fn watched(label: &'static str, mut child: Child) -> Self {
        let stderr = child.stderr.take().unwrap();
        let child = Arc::new(Mutex::new(child));
        let killing = Arc::new(AtomicBool::new(false));
        let (watched, killed) = (Arc::clone(&child), Arc::clone(&killing));
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[{label}] {line}");
            }
            // Stderr closes when the child exits; say how, unless the test is killing it.
            for _ in 0..50 {
                let status = watched.lock().unwrap().try_wait();
                if killed.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(Some(status)) = status {
                    eprintln!("[{label}] exited: {}", describe(status));
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self { child, killing }
    }

    /// Waits for `/health` on `port`, failing at once if the child has ended.
    pub fn wait_healthy(&self, port: u16) {
        let started = Instant::now();
        while !healthy(port) {
            let ended = self.child.lock().unwrap().try_wait();
            if let Ok(Some(status)) = ended {
                panic!(
                    "the server ended before it was healthy: {}",
                    describe(status)
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "server did not come up"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// An exit status with the signal that ended it, if one did.
fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (_, Some(signal)) => format!(
            "killed by signal {signal} (core dumped: {})",
            status.core_dumped()
        ),
        (Some(code), None) => format!("exit code {code}"),
        (None, None) => format!("{status}"),
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.killing.store(true, Ordering::SeqCst);
        let mut child = self
            .child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.write_all(b"GET /health HTTP/1.0\r\n\r\n");
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.ends_with("ok")
}
