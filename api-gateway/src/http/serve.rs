//! The HTTP server loop, with the bounds a shared front door needs: a cap
//! on open connections (further clients wait in the listen backlog), a
//! deadline for a request's headers (slow-loris clients, and keep-alive
//! connections idle for as long, are closed), and a graceful drain.
//! Request bodies have their own deadline in the handlers that read them.
//! Each request carries its connection's peer address (`ConnectInfo`), so
//! a handler can tell clients apart.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use axum::extract::ConnectInfo;
use tokio::net::TcpListener;
use tower::ServiceExt as _;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

/// Connection bounds.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest wait for a request's headers, also between requests on a
    /// kept-alive connection.
    pub header_timeout: Duration,
}

/// Serves `app` on `listener` until `stop` resolves, then lets in-flight
/// requests finish for at most `drain`.
pub async fn serve(listener: TcpListener, app: axum::Router, limits: HttpLimits, stop: impl std::future::Future<Output = ()>, drain: Duration) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(Some(limits.header_timeout)).keep_alive_timeout(limits.header_timeout);
    let builder = Arc::new(builder);
    let mut stop = std::pin::pin!(stop);
    loop {
        // At the cap, stop accepting: new clients wait in the kernel's backlog.
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s { Ok(s) => s, Err(_) => break },
            () = &mut stop => break,
        };
        let (stream, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone().map_request(move |mut r: axum::http::Request<hyper::body::Incoming>| {
            r.extensions_mut().insert(ConnectInfo(peer));
            r
        }));
        let (builder, header_timeout) = (builder.clone(), limits.header_timeout);
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            // The protocol is sniffed from the first bytes, before hyper's
            // own header timer runs: a client that sends nothing is cut off here.
            let mut first = [0u8; 1];
            if !matches!(tokio::time::timeout(header_timeout, stream.peek(&mut first)).await, Ok(Ok(1))) {
                debug!(%peer, "connection sent nothing in time; closed");
                return;
            }
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(conn).await {
                debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        warn!("in-flight requests did not finish in time; exiting");
    }
}
