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
//! | [`Fault::Latency`] | every chunk delayed, with jitter (up to half the delay more) |
//! | [`Fault::Refuse`] | new connections reset at once; open ones untouched |
//! | [`Fault::ResetOpen`] ([`FaultProxy::reset_open`]) | the connections open now reset; new ones pass |
//!
//! [`Fault::None`] heals: held bytes flow again (what a black hole held is delivered late, as
//! a network that recovers delivers it).
//!
//! A [`Schedule`] is a seeded random sequence of faults and how long each lasts, the same for
//! the same seed on every machine; [`FaultProxy::play`] plays one.

#![allow(dead_code)] // each test binary uses a part of it

use std::net::{SocketAddr, ToSocketAddrs};
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
    /// Delay every chunk, both ways, by `ms` and up to half as much again (jitter).
    Latency {
        /// The delay.
        ms: u64,
    },
    /// Reset new connections at once.
    Refuse,
    /// Reset the connections opened before the one numbered `from`; forward the others.
    ResetOpen {
        /// The number of the first connection spared.
        from: u64,
    },
}

/// A proxy on a free loopback port, forwarding to `upstream`; it stops with the runtime.
pub struct FaultProxy {
    pub port: u16,
    fault: watch::Sender<Fault>,
    /// How many connections were accepted.
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (fault, watching) = watch::channel(Fault::None);
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counting = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let serial = counting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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
                    relay(client, server, serial, watching).await;
                });
            }
        });
        FaultProxy {
            port,
            fault,
            accepted,
        }
    }

    /// Resets the connections open now; new ones pass.
    pub fn reset_open(&self) {
        let from = self.accepted.load(std::sync::atomic::Ordering::SeqCst);
        self.set(Fault::ResetOpen { from });
    }

    /// Makes `fault` the proxy's behaviour from now on.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Plays `schedule`, then heals.
    pub async fn play(&self, schedule: &Schedule) {
        for &(fault, lasting) in &schedule.steps {
            self.set(fault);
            tokio::time::sleep(lasting).await;
        }
        self.set(Fault::None);
    }

    /// A proxy in front of the server a test URL names (`var`), and the URL through it with
    /// `options` added; `None` when the variable is unset.
    pub async fn in_front_of(var: &str, options: &str) -> Option<(FaultProxy, String)> {
        let url = idem::store::conformance::test_server_url(var)?;
        let (server, _) = through(&url, 0, "");
        let proxy = FaultProxy::start(server).await;
        let (_, url) = through(&url, proxy.port, options);
        Some((proxy, url))
    }

    /// A raw connection through the proxy.
    pub async fn raw(&self) -> TcpStream {
        TcpStream::connect(("127.0.0.1", self.port)).await.unwrap()
    }
}

/// The address of the server `url` names, and `url` through a proxy on `port` with `options`.
fn through(url: &str, port: u16, options: &str) -> (SocketAddr, String) {
    let rest = url.split_once("://").unwrap().1;
    let authority = rest.split('/').next().unwrap();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let server = host_port.to_socket_addrs().unwrap().next().unwrap();
    let proxied = url.replacen(host_port, &format!("127.0.0.1:{port}"), 1);
    let sep = if proxied.contains('?') { '&' } else { '?' };
    (server, format!("{proxied}{sep}{options}"))
}

/// A reproducible random sequence of faults: from two to six steps of 20 to 300 ms each, every
/// step one fault (or none) with its parameters drawn from the seed.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The seed it was drawn from (printed when a property fails).
    pub seed: u64,
    /// Each fault and how long it lasts.
    pub steps: Vec<(Fault, Duration)>,
}

impl Schedule {
    /// The schedule of `seed`.
    pub fn from_seed(seed: u64) -> Schedule {
        let mut rng = SplitMix64(seed);
        let steps = (0..rng.between(2, 6))
            .map(|_| {
                let fault = match rng.between(0, 6) {
                    0 => Fault::None,
                    1 => Fault::Reset,
                    2 => Fault::BlackHole,
                    3 => Fault::SwallowReplies,
                    4 => Fault::CutReplies {
                        after: rng.between(1, 64) as usize,
                    },
                    5 => Fault::Latency {
                        ms: rng.between(5, 150),
                    },
                    _ => Fault::Refuse,
                };
                (fault, Duration::from_millis(rng.between(20, 300)))
            })
            .collect();
        Schedule { seed, steps }
    }

    /// How long it plays.
    pub fn length(&self) -> Duration {
        self.steps.iter().map(|(_, d)| *d).sum()
    }
}

/// SplitMix64 (Steele, Lea and Flood): a seed gives the same numbers on every machine and with
/// every version of every crate, which a schedule printed in a failure needs; `rand` does not
/// promise that for its default generators.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
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

async fn relay(
    client: TcpStream,
    server: TcpStream,
    serial: u64,
    watching: watch::Receiver<Fault>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let conn = Conn { serial };
    // Either side ending ends the connection.
    tokio::select! {
        () = pump(&mut client_read, &mut server_write, Way::Request, conn, watching.clone()) => {}
        () = pump(&mut server_read, &mut client_write, Way::Reply, conn, watching.clone()) => {}
    }
    if conn.is_reset_by(*watching.borrow()) {
        #[allow(deprecated)] // a zero linger resets at once, see `reset`
        let _ = client_write.as_ref().set_linger(Some(Duration::ZERO));
        #[allow(deprecated)]
        let _ = server_write.as_ref().set_linger(Some(Duration::ZERO));
    }
}

/// One relayed connection: its number, in the order connections were accepted.
#[derive(Clone, Copy)]
struct Conn {
    serial: u64,
}

impl Conn {
    fn is_reset_by(self, fault: Fault) -> bool {
        match fault {
            Fault::Reset => true,
            Fault::ResetOpen { from } => self.serial < from,
            _ => false,
        }
    }
}

/// Copies `from` to `to` under the current fault; returns when the connection ends or is reset.
async fn pump(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    way: Way,
    conn: Conn,
    mut watching: watch::Receiver<Fault>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut cut_sent = 0usize;
    // Jitter drawn from the connection's number: the same connections jitter the same way.
    let mut jitter = SplitMix64(conn.serial.wrapping_mul(2).wrapping_add(way as u64));
    loop {
        if !passable(&mut watching, way, conn, cut_sent).await {
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
        if !passable(&mut watching, way, conn, cut_sent).await {
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
            Fault::Latency { ms } => {
                let jitter = jitter.between(0, ms / 2);
                tokio::time::sleep(Duration::from_millis(ms + jitter)).await;
            }
            _ => {}
        }
        if !chunk.is_empty() && to.write_all(chunk).await.is_err() {
            return;
        }
    }
}

/// Waits while the fault holds traffic in this direction still; `false` when the connection
/// must end (a reset, or the proxy gone).
async fn passable(
    watching: &mut watch::Receiver<Fault>,
    way: Way,
    conn: Conn,
    cut_sent: usize,
) -> bool {
    loop {
        match *watching.borrow_and_update() {
            fault if conn.is_reset_by(fault) => return false,
            Fault::BlackHole => {}
            Fault::CutReplies { after } if way == Way::Reply && cut_sent >= after => {}
            _ => return true,
        }
        if watching.changed().await.is_err() {
            return false;
        }
    }
}
