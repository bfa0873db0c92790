//! A registry that serves one image and sends its layer blobs at a pace
//! the test sets: all at once, trickling, or part of a blob and then
//! nothing while the connection stays open (a stalled download). Plain
//! HTTP on 127.0.0.1; a thread per connection, all ended on drop.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::image::TestImage;

/// How the layer blobs are sent (manifests and the config always go at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobPace {
    /// All at once.
    Full,
    /// The headers and the first `n` bytes, then silence (the connection
    /// stays open until the registry is dropped).
    StallAfter(usize),
    /// The whole blob in `chunks` pieces, `every` apart.
    Trickle { chunks: usize, every: Duration },
}

struct Shared {
    repo: String,
    tag: String,
    image: TestImage,
    pace: Mutex<BlobPace>,
    stop: AtomicBool,
    /// Layer blob responses being sent now, and the most at once.
    blobs_in_flight: AtomicUsize,
    max_blobs_in_flight: AtomicUsize,
    /// Request lines, in order.
    requests: Mutex<Vec<String>>,
}

/// The registry; its threads end (and stalled connections close) on drop.
pub struct SlowRegistry {
    /// `127.0.0.1:<port>`.
    pub host: String,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl SlowRegistry {
    /// Serves `image` as `<repo>:<tag>` (and by digest).
    pub fn start(repo: &str, tag: &str, image: &TestImage, pace: BlobPace) -> SlowRegistry {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).unwrap();
        let host = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
        let shared = Arc::new(Shared {
            repo: repo.to_string(),
            tag: tag.to_string(),
            image: image.clone(),
            pace: Mutex::new(pace),
            stop: AtomicBool::new(false),
            blobs_in_flight: AtomicUsize::new(0),
            max_blobs_in_flight: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
        });
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = std::thread::spawn({
            let (shared, connections) = (shared.clone(), connections.clone());
            move || {
                while !shared.stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let shared = shared.clone();
                            let t = std::thread::spawn(move || {
                                let _ = serve(conn, &shared);
                            });
                            connections.lock().unwrap().push(t);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            }
        });
        SlowRegistry {
            host,
            shared,
            accept: Some(accept),
            connections,
        }
    }

    /// `<host>/<repo>:<tag>`.
    pub fn reference(&self) -> String {
        format!("{}/{}:{}", self.host, self.shared.repo, self.shared.tag)
    }

    /// Layer blobs requested from now on go at this pace.
    pub fn set_pace(&self, pace: BlobPace) {
        *self.shared.pace.lock().unwrap() = pace;
    }

    /// The most layer blobs that were being sent at once.
    pub fn max_blobs_in_flight(&self) -> usize {
        self.shared.max_blobs_in_flight.load(Ordering::SeqCst)
    }

    /// How many requests' lines contain `part` (e.g. a digest).
    pub fn count_requests(&self, part: &str) -> usize {
        let requests = self.shared.requests.lock().unwrap();
        requests.iter().filter(|r| r.contains(part)).count()
    }
}

impl Drop for SlowRegistry {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for t in self.connections.lock().unwrap().drain(..) {
            let _ = t.join();
        }
    }
}

/// Answers the requests of one connection (keep-alive) until it closes
/// or the registry stops.
fn serve(conn: TcpStream, shared: &Shared) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    // Short reads, so that a waiting connection notices the stop flag.
    conn.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut out = conn;
    loop {
        let Some(request_line) = read_request(&mut reader, shared)? else {
            return Ok(());
        };
        shared.requests.lock().unwrap().push(request_line.clone());
        let mut parts = request_line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let head = method == "HEAD";
        let image = &shared.image;
        let prefix = format!("/v2/{}/", shared.repo);
        if path == "/v2/" || path == "/v2" {
            respond(&mut out, 200, "application/json", b"{}", head)?;
        } else if let Some(reference) = path
            .strip_prefix(&prefix)
            .and_then(|p| p.strip_prefix("manifests/"))
        {
            if reference == shared.tag || reference == image.manifest_digest() {
                respond(&mut out, 200, image.manifest_type, &image.manifest, head)?;
            } else {
                respond(&mut out, 404, "application/json", NOT_FOUND, head)?;
            }
        } else if let Some(digest) = path
            .strip_prefix(&prefix)
            .and_then(|p| p.strip_prefix("blobs/"))
        {
            if digest == image.id() {
                respond(
                    &mut out,
                    200,
                    "application/octet-stream",
                    &image.config,
                    head,
                )?;
            } else if let Some(layer) = image.layers.iter().find(|l| l.digest() == digest) {
                if head {
                    respond(
                        &mut out,
                        200,
                        "application/octet-stream",
                        &layer.bytes,
                        true,
                    )?;
                } else {
                    let pace = *shared.pace.lock().unwrap();
                    send_layer(&mut out, &layer.bytes, pace, shared)?;
                }
            } else {
                respond(&mut out, 404, "application/json", NOT_FOUND, head)?;
            }
        } else {
            respond(&mut out, 404, "application/json", NOT_FOUND, head)?;
        }
    }
}

const NOT_FOUND: &[u8] = br#"{"errors":[{"code":"NOT_FOUND","message":"not found"}]}"#;

/// The request line of the next request (its headers read and dropped);
/// None when the client closed the connection or the registry stops.
fn read_request(
    reader: &mut BufReader<TcpStream>,
    shared: &Shared,
) -> std::io::Result<Option<String>> {
    let mut request_line = String::new();
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match reader.read_line(&mut request_line) {
            Ok(0) => return Ok(None),
            Ok(_) if request_line.ends_with('\n') => break,
            Ok(_) => {}
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e),
        }
    }
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return Ok(None),
            Ok(_) if line.trim().is_empty() => return Ok(Some(request_line.trim().to_string())),
            Ok(_) => {}
            Err(e) if is_timeout(&e) && !shared.stop.load(Ordering::Relaxed) => {}
            Err(e) => return Err(e),
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

fn respond(
    out: &mut TcpStream,
    code: u16,
    content_type: &str,
    body: &[u8],
    head: bool,
) -> std::io::Result<()> {
    write_headers(out, code, content_type, body)?;
    if !head {
        out.write_all(body)?;
    }
    out.flush()
}

fn write_headers(
    out: &mut TcpStream,
    code: u16,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let reason = if code == 200 { "OK" } else { "Not Found" };
    write!(
        out,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Docker-Content-Digest: {}\r\nDocker-Distribution-API-Version: registry/2.0\r\n\r\n",
        body.len(),
        super::image::sha(body),
    )
}

fn send_layer(
    out: &mut TcpStream,
    bytes: &[u8],
    pace: BlobPace,
    shared: &Shared,
) -> std::io::Result<()> {
    let now = shared.blobs_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    shared.max_blobs_in_flight.fetch_max(now, Ordering::SeqCst);
    let result = (|| {
        write_headers(out, 200, "application/octet-stream", bytes)?;
        match pace {
            BlobPace::Full => out.write_all(bytes)?,
            BlobPace::StallAfter(n) => {
                out.write_all(&bytes[..n.min(bytes.len())])?;
                out.flush()?;
                // Silence until the client gives up (closes) or the
                // registry stops; never the rest of the blob.
                let mut probe = [0u8; 1];
                while !shared.stop.load(Ordering::Relaxed) {
                    match out.peek(&mut probe) {
                        Ok(0) => break,
                        Ok(_) => std::thread::sleep(Duration::from_millis(20)),
                        Err(e) if is_timeout(&e) => {}
                        Err(_) => break,
                    }
                }
                return Err(std::io::Error::other("stalled on purpose"));
            }
            BlobPace::Trickle { chunks, every } => {
                let size = bytes.len().div_ceil(chunks.max(1)).max(1);
                for (i, piece) in bytes.chunks(size).enumerate() {
                    if i > 0 {
                        std::thread::sleep(every);
                    }
                    out.write_all(piece)?;
                    out.flush()?;
                }
            }
        }
        out.flush()
    })();
    shared.blobs_in_flight.fetch_sub(1, Ordering::SeqCst);
    result
}
