//! A UAPI client: what `ordo show` and `ordo up` use to talk to a running interface.

use super::socket_path;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

/// Sends one request and returns the reply's key=value pairs (without the errno line).
/// A non-zero errno becomes an error naming it.
pub fn request(ifname: &str, body: &str) -> io::Result<Vec<(String, String)>> {
    let path = socket_path(ifname);
    let mut s = UnixStream::connect(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot reach {} ({e}); is the interface up?", path.display()),
        )
    })?;
    s.write_all(body.as_bytes())?;
    let mut pairs = Vec::new();
    for line in BufReader::new(s).lines() {
        let line = line?;
        if line.is_empty() {
            break;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad reply line {line:?}")))?;
        if k == "errno" {
            let errno: i32 = v
                .parse()
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad errno"))?;
            if errno != 0 {
                return Err(io::Error::from_raw_os_error(errno.abs()));
            }
            return Ok(pairs);
        }
        pairs.push((k.to_string(), v.to_string()));
    }
    Err(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "reply ended without errno",
    ))
}

/// Interfaces with a UAPI socket.
pub fn list_interfaces() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(super::socket_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".sock").map(str::to_string))
        .filter(|n| UnixStream::connect(socket_path(n)).is_ok())
        .collect();
    names.sort();
    names
}
