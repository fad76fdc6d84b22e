//! A delaying TCP relay: it sits between Redis clients and Redis nodes and,
//! when the nemesis asks, really holds bytes on the path (a real network
//! delay, not a simulation; this machine's kernel has no netem).
//!
//! Each route accepts connections and pumps bytes to its target with one
//! task per direction. Over a control connection the nemesis arms a
//! one-shot hold for a client IP and a [`Direction`]: the next chunk read in
//! that direction on any connection of that client is held for the given
//! time, then forwarded, and the control connection hears `held` and then
//! `released` (or `lost`). The relay never reorders bytes within a
//! connection: later chunks queue behind a held one. A connection opened
//! after a hold fired is not held unless a hold is armed again, which is how
//! a late request can be overtaken by the requests of the client's new
//! connection. A held request is delivered even when the client has closed
//! its side meanwhile.
//!
//! Control protocol (`\n`-terminated lines): `hold <client-ip>
//! <request|reply> <ms> [<skip>]` answers `armed` (the hold lets `skip`
//! matching chunks pass first, 0 by default); `cancel` removes this
//! connection's armed holds and answers `cancelled <n>`; anything else
//! answers `error <message>`. Closing the control connection removes its
//! armed holds (a hold already firing still completes).

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

/// One listening address and the target it forwards to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Where the relay accepts clients.
    pub listen: SocketAddr,
    /// Where it connects for each client, as `host:port`.
    pub target: String,
}

/// A route that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad route {route:?}: {reason} (expected LISTEN=HOST:PORT)")]
pub struct RouteError {
    /// The text given.
    pub route: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FromStr for Route {
    type Err = RouteError;
    /// Parses `LISTEN=TARGET`, e.g. `0.0.0.0:6380=10.213.5.10:6379`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = |reason: String| RouteError {
            route: s.to_owned(),
            reason,
        };
        let (listen, target) = s.split_once('=').ok_or_else(|| error("no '='".into()))?;
        let listen = listen
            .parse()
            .map_err(|e| error(format!("listen address: {e}")))?;
        match target.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(Route {
                listen,
                target: target.to_owned(),
            }),
            _ => Err(error("target is not host:port".into())),
        }
    }
}

/// A direction of a relayed connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client to target.
    Request,
    /// Target to client.
    Reply,
}

/// An armed one-shot hold.
struct Hold {
    ip: IpAddr,
    direction: Direction,
    ms: u64,
    /// Matching chunks to let pass before the one held (`hold ... SKIP`):
    /// `1` holds the second request, such as the `DEL` after a `GET`.
    skip: u32,
    /// The control connection that armed it, and its event lines.
    owner: u64,
    events: UnboundedSender<String>,
}

/// The holds armed by all control connections, first armed first fired.
#[derive(Default)]
struct Table {
    holds: Mutex<Vec<Hold>>,
    next_owner: AtomicU64,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Hold>> {
        self.holds
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Removes and returns the first hold armed for `(ip, direction)`,
    /// unless it still has chunks to let pass (then counts this one). The
    /// `held` event (route `index`, `bytes`) is sent before the table is
    /// unlocked, so that a `cancel` answered after it cannot overtake it.
    fn take(&self, ip: IpAddr, direction: Direction, index: usize, bytes: usize) -> Option<Hold> {
        let mut holds = self.lock();
        let at = holds
            .iter()
            .position(|h| h.ip == ip && h.direction == direction)?;
        if holds[at].skip > 0 {
            holds[at].skip -= 1;
            return None;
        }
        let hold = holds.remove(at);
        let _ = hold
            .events
            .send(format!("held {index} {bytes} {}", hold.ms));
        Some(hold)
    }

    /// Removes the armed holds of `owner`; returns how many.
    fn cancel(&self, owner: u64) -> usize {
        let mut holds = self.lock();
        let before = holds.len();
        holds.retain(|h| h.owner != owner);
        before - holds.len()
    }

    /// Runs one control line of `owner`; returns the reply line.
    fn command(&self, owner: u64, events: &UnboundedSender<String>, line: &str) -> String {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["hold", ip, direction, ms, rest @ ..] if rest.len() <= 1 => {
                let Ok(skip) = rest.first().map_or(Ok(0), |s| s.parse::<u32>()) else {
                    return format!("error bad skip: {}", rest.join(" "));
                };
                let Ok(ip) = ip.parse::<IpAddr>() else {
                    return format!("error bad client ip: {ip}");
                };
                let direction = match *direction {
                    "request" => Direction::Request,
                    "reply" => Direction::Reply,
                    other => return format!("error bad direction: {other}"),
                };
                let Ok(ms) = ms.parse::<u64>() else {
                    return format!("error bad milliseconds: {ms}");
                };
                self.lock().push(Hold {
                    ip: ip.to_canonical(),
                    direction,
                    ms,
                    skip,
                    owner,
                    events: events.clone(),
                });
                "armed".to_owned()
            }
            ["cancel"] => format!("cancelled {}", self.cancel(owner)),
            _ => format!("error unknown command: {}", line.trim()),
        }
    }
}

/// Binds every route and the control address, then relays forever. Returns
/// only when a bind fails.
pub async fn serve(routes: Vec<Route>, control: SocketAddr) -> std::io::Result<()> {
    let mut bound = Vec::with_capacity(routes.len());
    for route in routes {
        bound.push((TcpListener::bind(route.listen).await?, route.target));
    }
    serve_on(bound, TcpListener::bind(control).await?).await;
    Ok(())
}

/// [`serve`] on listeners already bound: `(listener, target)` per route.
pub(crate) async fn serve_on(routes: Vec<(TcpListener, String)>, control: TcpListener) {
    let table = Arc::new(Table::default());
    for (index, (listener, target)) in routes.into_iter().enumerate() {
        let table = table.clone();
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((client, peer)) => {
                        let (table, target) = (table.clone(), target.clone());
                        tokio::spawn(connect(index, client, peer, target, table));
                    }
                    Err(e) => accept_failed("route", e).await,
                }
            }
        });
    }
    loop {
        match control.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(control_connection(stream, table.clone()));
            }
            Err(e) => accept_failed("control", e).await,
        }
    }
}

async fn accept_failed(what: &str, e: std::io::Error) {
    eprintln!("relay: {what} accept failed: {e}");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Connects one client to the target and starts the two pumps.
async fn connect(
    index: usize,
    client: TcpStream,
    peer: SocketAddr,
    target: String,
    table: Arc<Table>,
) {
    let server = match TcpStream::connect(&target).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("relay: route {index}: connect to {target} failed: {e}");
            return;
        }
    };
    for stream in [&client, &server] {
        if let Err(e) = stream.set_nodelay(true) {
            eprintln!("relay: route {index}: TCP_NODELAY: {e}");
        }
    }
    let ip = peer.ip().to_canonical();
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let sides = [
        (client_read, server_write, Direction::Request),
        (server_read, client_write, Direction::Reply),
    ];
    for (from, to, direction) in sides {
        tokio::spawn(pump(from, to, index, ip, direction, table.clone()));
    }
}

/// Forwards one direction until its source ends, holding chunks as armed.
/// After a failed write it keeps reading and discarding, so that the source
/// socket is not reset under the other direction. Dropping the halves only
/// shuts down writing; a socket closes once both its halves are dropped.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    index: usize,
    ip: IpAddr,
    direction: Direction,
    table: Arc<Table>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    let mut open = true;
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                eprintln!("relay: route {index} {direction:?} from {ip}: read failed: {e}");
                break;
            }
        };
        if !open {
            continue;
        }
        let hold = table.take(ip, direction, index, n);
        if let Some(hold) = &hold {
            tokio::time::sleep(Duration::from_millis(hold.ms)).await;
        }
        let written = to.write_all(&buffer[..n]).await;
        if let Some(hold) = &hold {
            let event = if written.is_ok() { "released" } else { "lost" };
            let _ = hold.events.send(format!("{event} {index} {n}"));
        }
        if let Err(e) = written {
            eprintln!("relay: route {index} {direction:?} for {ip}: write failed: {e}");
            open = false;
        }
    }
    if open {
        let _ = to.shutdown().await;
    }
}

/// One control connection: commands in, replies and hold events out (one
/// writer, so `armed` always precedes that hold's `held`).
async fn control_connection(stream: TcpStream, table: Arc<Table>) {
    let owner = table.next_owner.fetch_add(1, Ordering::Relaxed);
    let (read, mut write) = stream.into_split();
    let (events, mut lines_out) = unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Some(line) = lines_out.recv().await {
            if write
                .write_all(format!("{line}\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let mut lines = BufReader::new(read).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                let _ = events.send(table.command(owner, &events, &line));
            }
            Ok(None) => break,
            Err(e) => {
                eprintln!("relay: control connection {owner}: {e}");
                break;
            }
        }
    }
    table.cancel(owner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tokio::io::Lines;

    type Control = (Lines<BufReader<OwnedReadHalf>>, OwnedWriteHalf);

    /// A relay with one route to `target`; returns its route address and
    /// a control connection.
    async fn relay(target: SocketAddr) -> (SocketAddr, Control) {
        let route = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let control = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (route_addr, control_addr) =
            (route.local_addr().unwrap(), control.local_addr().unwrap());
        tokio::spawn(serve_on(vec![(route, target.to_string())], control));
        let (read, write) = TcpStream::connect(control_addr).await.unwrap().into_split();
        (route_addr, (BufReader::new(read).lines(), write))
    }

    async fn say(control: &mut Control, line: &str) -> String {
        control
            .1
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        next(control).await
    }

    async fn next(control: &mut Control) -> String {
        let line = tokio::time::timeout(Duration::from_secs(5), control.0.next_line());
        line.await.unwrap().unwrap().unwrap()
    }

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, bytes: &[u8]) {
        stream.write_all(bytes).await.unwrap();
        let mut back = vec![0; bytes.len()];
        stream.read_exact(&mut back).await.unwrap();
        assert_eq!(back, bytes);
    }

    #[tokio::test]
    async fn forwards_both_ways() {
        let (route, _control) = relay(echo_server().await).await;
        let mut client = TcpStream::connect(route).await.unwrap();
        round_trip(&mut client, b"PING\r\n").await;
        round_trip(&mut client, &[7u8; 100_000]).await;
    }

    #[tokio::test]
    async fn a_held_request_is_delayed_once() {
        let (route, mut control) = relay(echo_server().await).await;
        assert_eq!(
            say(&mut control, "hold 127.0.0.1 request 300").await,
            "armed"
        );
        let mut client = TcpStream::connect(route).await.unwrap();
        let start = Instant::now();
        round_trip(&mut client, b"late").await;
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert_eq!(next(&mut control).await, "held 0 4 300");
        assert_eq!(next(&mut control).await, "released 0 4");
        round_trip(&mut client, b"next").await;
        // Had `next` been held, its `held` line would come before this reply.
        assert_eq!(say(&mut control, "cancel").await, "cancelled 0");
    }

    #[tokio::test]
    async fn a_skip_lets_the_first_request_pass() {
        let (route, mut control) = relay(echo_server().await).await;
        assert_eq!(
            say(&mut control, "hold 127.0.0.1 request 200 1").await,
            "armed"
        );
        let mut client = TcpStream::connect(route).await.unwrap();
        round_trip(&mut client, b"first").await;
        let start = Instant::now();
        round_trip(&mut client, b"second").await;
        assert!(start.elapsed() >= Duration::from_millis(200));
        assert_eq!(next(&mut control).await, "held 0 6 200");
        assert_eq!(next(&mut control).await, "released 0 6");
        assert!(say(&mut control, "hold 127.0.0.1 request 200 x")
            .await
            .starts_with("error"));
    }

    #[tokio::test]
    async fn a_held_request_outlives_its_client() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap();
        let (received_tx, received) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut all = Vec::new();
            let _ = stream.read_to_end(&mut all).await;
            let _ = received_tx.send(all);
        });
        let (route, mut control) = relay(target).await;
        assert_eq!(
            say(&mut control, "hold 127.0.0.1 request 200").await,
            "armed"
        );
        let start = Instant::now();
        let mut client = TcpStream::connect(route).await.unwrap();
        client.write_all(b"SET k v").await.unwrap();
        drop(client);
        let received = tokio::time::timeout(Duration::from_secs(5), received);
        assert_eq!(received.await.unwrap().unwrap(), b"SET k v");
        assert!(start.elapsed() >= Duration::from_millis(200));
        assert_eq!(next(&mut control).await, "held 0 7 200");
        assert_eq!(next(&mut control).await, "released 0 7");
    }

    #[tokio::test]
    async fn cancel_errors_and_bad_routes() {
        let (_route, mut control) = relay(echo_server().await).await;
        assert_eq!(say(&mut control, "hold 127.0.0.1 reply 100").await, "armed");
        assert_eq!(
            say(&mut control, "hold 127.0.0.1 request 100").await,
            "armed"
        );
        assert_eq!(say(&mut control, "cancel").await, "cancelled 2");
        assert!(say(&mut control, "bogus").await.starts_with("error "));
        assert!(say(&mut control, "hold nowhere request 5")
            .await
            .starts_with("error "));
        assert!("nonsense".parse::<Route>().is_err());
        assert!("0.0.0.0:6380=nohost".parse::<Route>().is_err());
        let route: Route = "0.0.0.0:6380=10.213.5.10:6379".parse().unwrap();
        assert_eq!(route.listen, "0.0.0.0:6380".parse().unwrap());
        assert_eq!(route.target, "10.213.5.10:6379");
    }
}
