//! Accepting connections with limits a client cannot push past: a bound on open
//! connections (more wait in the listen backlog), a deadline for each request's headers
//! (a client that opens a connection and sends nothing, or one header line, is dropped),
//! and one for each write (a client that stops reading a streamed reply is dropped, its
//! request cancelled). `axum::serve` has none of them: hyper's header timeout is off there.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::write_deadline::WriteDeadline;

/// How connections are accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once (default 256); more wait to be accepted.
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

/// Serves `app` on `listener` until `shutdown` completes (then stops accepting; the
/// connections open then are closed as their tasks are dropped with the runtime).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = open.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => return,
        };
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
        let service = TowerToHyperService::new(app.clone());
        let (header_timeout, write_timeout) = (limits.header_timeout, limits.write_timeout);
        tokio::spawn(async move {
            let stream = WriteDeadline::new(stream, write_timeout);
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
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

    #[test]
    fn connections_over_the_bound_wait_for_one_to_close() {
        let limits = ConnectionLimits {
            max_connections: 1,
            header_timeout: Duration::from_secs(2),
            ..ConnectionLimits::default()
        };
        let (addr, _runtime) = start(limits);
        // The one connection allowed, idle: the next waits until its deadline frees it.
        let _idle = std::net::TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        assert!(get_health(addr).ends_with("ok"));
        assert!(
            started.elapsed() >= Duration::from_millis(1500),
            "served at once: {:?}",
            started.elapsed()
        );
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
