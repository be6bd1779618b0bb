//! The endpoint's HTTP side: `GET /metrics` answers with the device's figures, anything else
//! with 404 or 405. Anyone who can reach the address can connect, so nothing a client does
//! may cost the daemon more than a bounded share:
//! - one thread, whatever the number of clients (connections are tasks of a single-threaded
//!   runtime), which answers one request at a time, so that scrapes never compete with each
//!   other for the device's locks (a scrape reads the device for a few milliseconds);
//! - at most [`Limits::connections`] open at once: a connection beyond them sheds the oldest
//!   one that has not finished sending its request (an idle client), or is closed if every one
//!   is being answered;
//! - a request must arrive whole within [`Limits::request`] of the connection and fit in
//!   [`MAX_REQUEST`] bytes, and its answer be taken within [`Limits::response`];
//! - one request per connection (`Connection: close`), as a Prometheus scrape needs.
//!
//! A failed accept (out of descriptors) waits [`ACCEPT_BACKOFF`] instead of spinning, and
//! nothing here panics on a client's doing.

use super::exposition;
use crate::device::Device;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// What one client may hold of the endpoint.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections held at once.
    pub connections: usize,
    /// How long a client has from connecting to the end of its request.
    pub request: Duration,
    /// How long a client has to take the answer.
    pub response: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: 64,
            request: Duration::from_secs(5),
            response: Duration::from_secs(10),
        }
    }
}
/// The largest request head taken (Prometheus sends a few hundred bytes).
pub const MAX_REQUEST: usize = 8192;
/// Pause after a failed accept (EMFILE: out of descriptors), rather than spin on it.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Headers parsed of a request; more is an error.
const MAX_HEADERS: usize = 32;

/// The endpoint's socket, bound (before the daemon gives up its privileges) and not yet
/// answering.
pub struct Endpoint {
    listener: std::net::TcpListener,
    address: SocketAddr,
}

impl Endpoint {
    pub fn bind(address: SocketAddr) -> io::Result<Endpoint> {
        let listener = std::net::TcpListener::bind(address)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen for metrics on {address}: {e}")))?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr().unwrap_or(address);
        Ok(Endpoint { listener, address })
    }

    /// Where it listens (the port the kernel chose, for port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Answers requests on a thread of its own until the process ends.
    pub fn serve(self, device: Arc<Device>) -> io::Result<()> {
        self.serve_with(Limits::default(), move || exposition::render(&device))
    }

    /// Answers requests with what `render` gives, within `limits`.
    pub fn serve_with(self, limits: Limits, render: impl Fn() -> String + Send + 'static) -> io::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name("ordo-metrics".into()).spawn(move || {
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, async move {
                match TcpListener::from_std(self.listener) {
                    Ok(listener) => accept_loop(listener, limits, Rc::new(render)).await,
                    Err(e) => log::error!("metrics endpoint: {e}"),
                }
            })
        })?;
        Ok(())
    }
}

/// What the accept loop knows of an open connection.
struct Open {
    /// Still reading its request: the first to be shed.
    reading: bool,
    /// Closes it when sent (or dropped).
    shed: oneshot::Sender<()>,
}

/// The open connections by the order they came in (the oldest first), shared by the accept
/// loop and the connections' tasks, all on one thread.
type Table = Rc<RefCell<BTreeMap<u64, Open>>>;

async fn accept_loop<F: Fn() -> String + 'static>(listener: TcpListener, limits: Limits, render: Rc<F>) {
    let table: Table = Rc::default();
    let mut next = 0u64;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                log::warn!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let (shed, shed_signal) = oneshot::channel();
        let shed_one = {
            let mut open = table.borrow_mut();
            let mut shed_one = false;
            if open.len() >= limits.connections {
                let idle = open.iter().find(|(_, c)| c.reading).map(|(id, _)| *id);
                match idle.and_then(|id| open.remove(&id)) {
                    Some(oldest) => {
                        let _ = oldest.shed.send(());
                        shed_one = true;
                    }
                    // Every one is being answered: this one waits for nothing.
                    None => continue,
                }
            }
            open.insert(next, Open { reading: true, shed });
            shed_one
        };
        let id = next;
        next += 1;
        let (render, table) = (render.clone(), table.clone());
        tokio::task::spawn_local(async move {
            tokio::select! {
                _ = shed_signal => {}
                _ = serve_connection(stream, limits, &*render, &table, id) => {}
            }
            table.borrow_mut().remove(&id);
        });
        if shed_one {
            // The shed connection's task closes it when it next runs: let it run before the
            // next accept, so that the descriptors held stay at the limit under a flood.
            tokio::task::yield_now().await;
        }
    }
}

/// One connection: its request, within the deadline, then its answer.
async fn serve_connection(mut stream: TcpStream, limits: Limits, render: &dyn Fn() -> String, table: &Table, id: u64) {
    let request = match tokio::time::timeout(limits.request, read_request(&mut stream)).await {
        Ok(r) => r,
        // Too slow: closed without a word.
        Err(_) => return,
    };
    if let Some(c) = table.borrow_mut().get_mut(&id) {
        c.reading = false;
    }
    let response = match request {
        Ok(Request { get, path }) => answer(render, get, &path),
        Err(refused) => refused,
    };
    let bytes = response.bytes();
    let _ = tokio::time::timeout(limits.response, async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    })
    .await;
}

/// A well-formed request: whether its method was GET, and its path without the query.
struct Request {
    get: bool,
    path: String,
}

/// An answer: the status, its reason, the body and its content type.
struct Response {
    status: u16,
    reason: &'static str,
    body: String,
    content_type: &'static str,
}

impl Response {
    fn text(status: u16, reason: &'static str, body: &str) -> Response {
        Response {
            status,
            reason,
            body: body.to_string(),
            content_type: "text/plain; charset=utf-8",
        }
    }

    fn bytes(self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        out.extend_from_slice(self.body.as_bytes());
        out
    }
}

/// Reads a request head (up to the blank line that ends it) and parses it; Err: the answer
/// to a malformed or oversized one.
async fn read_request(stream: &mut TcpStream) -> Result<Request, Response> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|_| Response::text(400, "Bad Request", "cannot read the request\n"))?;
        if n == 0 {
            return Err(Response::text(400, "Bad Request", "the request ended early\n"));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                let get = request.method == Some("GET");
                let path = request.path.unwrap_or("").split('?').next().unwrap_or("").to_string();
                return Ok(Request { get, path });
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_REQUEST => continue,
            Ok(httparse::Status::Partial) => {
                return Err(Response::text(
                    431,
                    "Request Header Fields Too Large",
                    "request too large\n",
                ))
            }
            Err(_) => return Err(Response::text(400, "Bad Request", "malformed request\n")),
        }
    }
}

/// The answer to a well-formed request.
fn answer(render: &dyn Fn() -> String, get: bool, path: &str) -> Response {
    match (get, path) {
        (true, "/metrics") => Response {
            status: 200,
            reason: "OK",
            body: render(),
            content_type: exposition::CONTENT_TYPE,
        },
        (true, _) => Response::text(404, "Not Found", "Ordo: metrics at /metrics\n"),
        (false, _) => Response::text(405, "Method Not Allowed", "only GET\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream as Client;

    fn scrape(address: SocketAddr) -> String {
        let mut c = Client::connect(address).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        answer
    }

    /// Whether the server has closed `c` (a read sees the end, or a reset), without waiting.
    fn closed(c: &mut Client) -> bool {
        c.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        !matches!(c.read(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// A client holding many idle connections keeps neither a scrape out nor more than the
    /// limit of the endpoint's connections; one that sends half a request is closed at its
    /// deadline; malformed, oversized and other requests get their status.
    #[test]
    fn idle_and_slow_clients_are_bounded() {
        let endpoint = Endpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let address = endpoint.address();
        let limits = Limits {
            connections: 8,
            request: Duration::from_millis(500),
            response: Duration::from_secs(2),
        };
        endpoint.serve_with(limits, || "figures 1\n".to_string()).unwrap();
        let mut idle: Vec<Client> = (0..200).map(|_| Client::connect(address).unwrap()).collect();
        let answer = scrape(address);
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nfigures 1\n"), "{answer}");
        // Every idle one beyond the limit was shed (the last few may still be held).
        let open = idle.iter_mut().map(closed).filter(|c| !c).count();
        assert!(open <= limits.connections, "{open} idle connections held");
        // Half a request: closed at the deadline, with no answer.
        let mut slow = Client::connect(address).unwrap();
        slow.write_all(b"GET /metr").unwrap();
        slow.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let started = std::time::Instant::now();
        let mut got = Vec::new();
        let _ = slow.read_to_end(&mut got);
        assert!(got.is_empty(), "a slow client got {got:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "closed after {:?}",
            started.elapsed()
        );
        for (request, status) in [
            (b"GET / HTTP/1.1\r\n\r\n".to_vec(), "404"),
            (b"POST /metrics HTTP/1.1\r\n\r\n".to_vec(), "405"),
            (b"\x00\x01 nonsense\r\n\r\n".to_vec(), "400"),
            (
                [b"GET /metrics HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 9000]].concat(),
                "431",
            ),
        ] {
            let mut c = Client::connect(address).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c.write_all(&request).unwrap();
            let mut answer = String::new();
            let _ = c.read_to_string(&mut answer);
            assert!(answer.starts_with(&format!("HTTP/1.1 {status} ")), "{answer}");
        }
    }
}
