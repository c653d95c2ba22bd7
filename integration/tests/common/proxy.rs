//! A TCP fault proxy for tests: placed between idem and a real Postgres or Redis, it forwards
//! bytes both ways and, on command, makes the faults real networks make. Include it with
//! `#[path = "common/proxy.rs"] mod proxy;`.
//!
//! | fault | what the client sees |
//! |---|---|
//! | [`Fault::Reset`] | every connection closed with a reset (RST), new ones too |
//! | [`Fault::BlackHole`] | nothing more in either direction, sockets left open |
//! | [`Fault::SwallowReplies`] | requests reach the server, its replies never come back |
//! | [`Fault::CutReplies`] | replies stop after so many more bytes, sockets left open |
//! | [`Fault::Latency`] | every chunk delayed |
//! | [`Fault::Refuse`] | new connections reset at once; open ones untouched |
//!
//! [`Fault::None`] heals: held bytes flow again (what a black hole held is delivered late, as
//! a network that recovers delivers it).

#![allow(dead_code)] // each test binary uses a part of it

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to the traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    None,
    /// Reset every connection, open and new.
    Reset,
    /// Forward nothing, close nothing.
    BlackHole,
    /// Forward requests; drop the replies.
    SwallowReplies,
    /// Forward at most this many more bytes of replies per connection, then nothing.
    CutReplies {
        /// Bytes still forwarded.
        after: usize,
    },
    /// Delay every chunk, both ways.
    Latency {
        /// The delay.
        ms: u64,
    },
    /// Reset new connections at once.
    Refuse,
}

/// A proxy on a free loopback port, forwarding to `upstream`; it stops with the runtime.
pub struct FaultProxy {
    pub port: u16,
    fault: watch::Sender<Fault>,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (fault, watching) = watch::channel(Fault::None);
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let now = *watching.borrow();
                if matches!(now, Fault::Refuse | Fault::Reset) {
                    reset(client);
                    continue;
                }
                let watching = watching.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        reset(client);
                        return;
                    };
                    relay(client, server, watching).await;
                });
            }
        });
        FaultProxy { port, fault }
    }

    /// Makes `fault` the proxy's behaviour from now on.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }
}

/// Closes `stream` with a reset rather than a FIN. (tokio deprecates `set_linger` because a
/// lingering close blocks the thread; a zero linger does not linger: it resets at once.)
#[allow(deprecated)]
fn reset(stream: TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// Which way bytes go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Request,
    Reply,
}

async fn relay(client: TcpStream, server: TcpStream, watching: watch::Receiver<Fault>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Either side ending ends the connection.
    tokio::select! {
        () = pump(&mut client_read, &mut server_write, Way::Request, watching.clone()) => {}
        () = pump(&mut server_read, &mut client_write, Way::Reply, watching.clone()) => {}
    }
    if *watching.borrow() == Fault::Reset {
        #[allow(deprecated)] // a zero linger resets at once, see `reset`
        let _ = client_write.as_ref().set_linger(Some(Duration::ZERO));
        #[allow(deprecated)]
        let _ = server_write.as_ref().set_linger(Some(Duration::ZERO));
    }
}

/// Copies `from` to `to` under the current fault; returns when the connection ends or is reset.
async fn pump(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    way: Way,
    mut watching: watch::Receiver<Fault>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut cut_sent = 0usize;
    loop {
        if !passable(&mut watching, way, cut_sent).await {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = watching.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        // Read under one fault, maybe sent under another: a black hole now holds the chunk.
        if !passable(&mut watching, way, cut_sent).await {
            return;
        }
        let mut chunk = &buf[..n];
        let now = *watching.borrow();
        match now {
            Fault::SwallowReplies if way == Way::Reply => continue,
            Fault::CutReplies { after } if way == Way::Reply => {
                chunk = &chunk[..chunk.len().min(after.saturating_sub(cut_sent))];
                cut_sent += chunk.len();
            }
            Fault::Latency { ms } => tokio::time::sleep(Duration::from_millis(ms)).await,
            _ => {}
        }
        if !chunk.is_empty() && to.write_all(chunk).await.is_err() {
            return;
        }
    }
}

/// Waits while the fault holds traffic in this direction still; `false` when the connection
/// must end (a reset, or the proxy gone).
async fn passable(watching: &mut watch::Receiver<Fault>, way: Way, cut_sent: usize) -> bool {
    loop {
        match *watching.borrow_and_update() {
            Fault::Reset => return false,
            Fault::BlackHole => {}
            Fault::CutReplies { after } if way == Way::Reply && cut_sent >= after => {}
            _ => return true,
        }
        if watching.changed().await.is_err() {
            return false;
        }
    }
}
