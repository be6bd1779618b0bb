//! Text that carries keys (UAPI requests and replies, the `set` that `ordo up` sends), held so
//! that no copy of it is left in freed memory. A `String` that grows moves its bytes to a new
//! allocation and frees the old one as it is; `BufReader`'s buffer is freed as it is. Here
//! every allocation that held such text is wiped before it is freed.

use std::fmt;
use std::io::{self, BufRead, Read};
use zeroize::Zeroizing;

/// A string for text with secrets in it: written with `write!`, it grows into a new wiped-on-
/// drop allocation and wipes the old one, instead of leaving it behind.
#[derive(Default)]
pub struct SecretText(Zeroizing<String>);

impl SecretText {
    pub fn new() -> SecretText {
        SecretText::default()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn push_str(&mut self, s: &str) {
        if self.0.capacity() - self.0.len() < s.len() {
            let want = (self.0.len() + s.len()).max(self.0.capacity() * 2).max(256);
            let mut bigger = Zeroizing::new(String::with_capacity(want));
            bigger.push_str(&self.0);
            // The old allocation is wiped as it is dropped here.
            self.0 = bigger;
        }
        self.0.push_str(s);
    }
}

impl std::ops::Deref for SecretText {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Write for SecretText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

/// A buffered reader whose buffer is wiped when dropped (`BufReader`'s is not).
pub struct SecretReader<R> {
    inner: R,
    buf: Zeroizing<Vec<u8>>,
    pos: usize,
    filled: usize,
}

impl<R: Read> SecretReader<R> {
    pub fn new(inner: R) -> SecretReader<R> {
        SecretReader {
            inner,
            buf: Zeroizing::new(vec![0; 8192]),
            pos: 0,
            filled: 0,
        }
    }
}

impl<R: Read> Read for SecretReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = {
            let available = self.fill_buf()?;
            let n = available.len().min(out.len());
            out[..n].copy_from_slice(&available[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

impl<R: Read> BufRead for SecretReader<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos == self.filled {
            self.filled = self.inner.read(&mut self.buf)?;
            self.pos = 0;
        }
        Ok(&self.buf[self.pos..self.filled])
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.filled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write;

    #[test]
    fn text_grows_and_reads_back_whole() {
        let mut t = SecretText::new();
        for i in 0..1000 {
            let _ = writeln!(t, "line {i}");
        }
        assert_eq!(t.as_str().lines().count(), 1000);
        assert_eq!(t.as_str().lines().nth(999), Some("line 999"));
    }

    #[test]
    fn the_reader_reads_lines_across_its_buffer() {
        let text: String = (0..3000).map(|i| format!("key{i}=value{i}\n")).collect();
        let mut r = SecretReader::new(text.as_bytes());
        let mut line = Vec::new();
        let mut n = 0;
        while r.read_until(b'\n', &mut line).unwrap() > 0 {
            assert_eq!(line, format!("key{n}=value{n}\n").as_bytes());
            line.clear();
            n += 1;
        }
        assert_eq!(n, 3000);
        let mut rest = Vec::new();
        let mut r = SecretReader::new(&b"abc"[..]);
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"abc");
    }
}
