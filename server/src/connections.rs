//! Accepting connections with limits a client cannot push past: a bound on open
//! connections, a deadline for each request's headers (a client that opens a connection
//! and sends nothing, or one header line, is dropped), and one for each write (a client
//! that stops reading a streamed reply is dropped, its request cancelled). `axum::serve`
//! has none of them: hyper's header timeout is off there.
//!
//! Kept-alive connections cannot starve a new client: at the bound, a client that
//! connects has the oldest open connection told to close once its request in flight is
//! answered (at once if it is idle between requests), and is served on its place.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};

use super::write_deadline::WriteDeadline;

/// How connections are accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once (default 256); at the bound a new one takes the place of
    /// the oldest, once that one has answered its request in flight.
    pub max_connections: usize,
    /// Time a client has to send a request's headers, the first request's or the next on a
    /// kept-alive connection (default 10 s).
    pub header_timeout: Duration,
    /// Time a write to a client may wait for it to read (default 30 s): a streamed reply
    /// whose client reads nothing for this long is cancelled.
    pub write_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// The open connections, oldest first, each with the signal that asks it to close.
#[derive(Default)]
struct Open {
    next_id: u64,
    connections: VecDeque<(u64, Arc<Notify>)>,
}

fn lock(open: &Mutex<Open>) -> std::sync::MutexGuard<'_, Open> {
    open.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves `app` on `listener` until `shutdown` completes (then stops accepting; the
/// connections open then are closed as their tasks are dropped with the runtime).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let places = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let open = Arc::new(Mutex::new(Open::default()));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, or the peer gave up during the handshake:
                    // the listener itself is fine, so wait a moment and go on.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let place = match places.clone().try_acquire_owned() {
            Ok(place) => place,
            Err(_) => {
                // Full: the oldest connection closes once its request in flight is
                // answered (at once if idle), and this one takes its place.
                if let Some((_, close)) = lock(&open).connections.pop_front() {
                    close.notify_one();
                }
                tokio::select! {
                    place = places.clone().acquire_owned() => place.expect("the semaphore is never closed"),
                    () = &mut shutdown => return,
                }
            }
        };
        let close = Arc::new(Notify::new());
        let id = {
            let mut open = lock(&open);
            open.next_id += 1;
            let id = open.next_id;
            open.connections.push_back((id, close.clone()));
            id
        };
        let service = TowerToHyperService::new(app.clone());
        let (header_timeout, write_timeout) = (limits.header_timeout, limits.write_timeout);
        let open = open.clone();
        tokio::spawn(async move {
            let stream = WriteDeadline::new(stream, write_timeout);
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = close.notified() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            lock(&open).connections.retain(|(other, _)| *other != id);
            drop(place);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use std::io::{Read, Write};
    use std::time::Instant;

    /// A server of one route on a port of its own, in a runtime of its own.
    fn start(limits: ConnectionLimits) -> (std::net::SocketAddr, tokio::runtime::Runtime) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .route("/health", get(|| async { "ok" }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    "ok"
                }),
            )
            .route("/endless", get(endless));
        runtime.spawn(serve(listener, app, limits, std::future::pending()));
        (addr, runtime)
    }

    /// Set when the endless reply's body is dropped (its connection closed).
    static ENDLESS_DROPPED: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    struct Endless;

    impl Drop for Endless {
        fn drop(&mut self) {
            ENDLESS_DROPPED.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A reply that never ends, 64 KiB at a time, as a stream that a client stops reading.
    async fn endless() -> axum::body::Body {
        let chunks = futures::stream::unfold(Endless, |state| async move {
            let chunk = axum::body::Bytes::from(vec![b'x'; 64 << 10]);
            Some((Ok::<_, std::io::Error>(chunk), state))
        });
        axum::body::Body::from_stream(chunks)
    }

    fn get_health(addr: std::net::SocketAddr) -> String {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    }

    #[test]
    fn a_client_that_never_finishes_its_headers_is_dropped() {
        let limits = ConnectionLimits {
            header_timeout: Duration::from_millis(300),
            ..ConnectionLimits::default()
        };
        let (addr, _runtime) = start(limits);
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let started = Instant::now();
        let mut rest = Vec::new();
        // The server closes the connection (a read of nothing, or a reset), with at most a
        // 408; a server without the deadline would hold it until the read timed out.
        let closed = match slow.read_to_end(&mut rest) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(closed, "still open after {:?}", started.elapsed());
        assert!(started.elapsed() < Duration::from_secs(4));
        let rest = String::from_utf8_lossy(&rest);
        assert!(
            rest.is_empty() || rest.starts_with("HTTP/1.1 408"),
            "{rest}"
        );
        // Others are still served.
        assert!(get_health(addr).ends_with("ok"));
    }

    /// Sends one request on `stream` and reads its reply (a body of known length).
    fn request_on(stream: &mut std::net::TcpStream, path: &str) -> String {
        write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while !String::from_utf8_lossy(&reply).ends_with("ok") {
            stream.read_exact(&mut byte).unwrap();
            reply.push(byte[0]);
        }
        String::from_utf8_lossy(&reply).into_owned()
    }

    #[test]
    fn at_the_bound_a_new_client_waits_only_for_the_request_in_flight() {
        let limits = ConnectionLimits {
            max_connections: 1,
            ..ConnectionLimits::default()
        };
        let (addr, _runtime) = start(limits);
        // The one place taken by a request that takes 1.5 s: the next client is served
        // once it is answered, not before.
        let mut busy = std::net::TcpStream::connect(addr).unwrap();
        busy.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(busy, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        assert!(get_health(addr).ends_with("ok"));
        let waited = started.elapsed();
        assert!(
            (Duration::from_millis(1200)..Duration::from_secs(8)).contains(&waited),
            "served after {waited:?}"
        );
        // The slow request was answered whole before its connection closed.
        let mut reply = String::new();
        busy.read_to_string(&mut reply).unwrap();
        assert!(
            reply.starts_with("HTTP/1.1 200") && reply.ends_with("ok"),
            "{reply}"
        );
    }

    #[test]
    fn kept_alive_connections_at_the_bound_do_not_starve_a_new_client() {
        let limits = ConnectionLimits {
            max_connections: 4,
            header_timeout: Duration::from_secs(60),
            ..ConnectionLimits::default()
        };
        let (addr, _runtime) = start(limits);
        // Four clients each ask once and keep their connections open, idle.
        let mut kept: Vec<std::net::TcpStream> = (0..4)
            .map(|_| {
                let mut stream = std::net::TcpStream::connect(addr).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                assert!(request_on(&mut stream, "/health").starts_with("HTTP/1.1 200"));
                stream
            })
            .collect();
        // A fifth is served at once, not after the idle ones' 60 s.
        for _ in 0..3 {
            let started = Instant::now();
            assert!(get_health(addr).ends_with("ok"));
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{:?}",
                started.elapsed()
            );
        }
        // The oldest were the ones closed; the newest kept connection still serves.
        let mut rest = Vec::new();
        assert_eq!(kept[0].read_to_end(&mut rest).unwrap_or(0), 0, "closed");
        assert!(request_on(&mut kept[3], "/health").starts_with("HTTP/1.1 200"));
        kept.clear();
    }

    #[test]
    fn a_client_that_stops_reading_a_stream_is_dropped() {
        let limits = ConnectionLimits {
            write_timeout: Duration::from_millis(500),
            ..ConnectionLimits::default()
        };
        let (addr, _runtime) = start(limits);
        let mut reader = std::net::TcpStream::connect(addr).unwrap();
        reader
            .write_all(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        // Never read: the buffers fill, the server's write waits, and then fails.
        let started = Instant::now();
        while !ENDLESS_DROPPED.load(std::sync::atomic::Ordering::SeqCst) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the reply still streams to a client that reads nothing"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(started.elapsed() >= Duration::from_millis(500));
        // Others are still served.
        assert!(get_health(addr).ends_with("ok"));
        drop(reader);
    }
}
