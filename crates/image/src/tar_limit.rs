//! A bound on the tar metadata read for one entry.
//!
//! The tar crate reads a GNU long name or long link, a PAX record block and
//! a GNU sparse map into memory whole, whatever size the archive claims: a
//! zstd layer of a few KB can claim a 10 GB long name, or a sparse map that
//! grows a list four times its size, and exhaust the daemon's memory. Go's
//! archive/tar (which containerd uses) caps each of these at 1 MiB.
//!
//! [`Entries`] wraps the tar crate's iterator over a [`Counted`] stream:
//! while the tar crate looks for the next entry, it may read what is left
//! of the previous entry's data plus at most [`MAX_ENTRY_METADATA`] bytes;
//! a read beyond fails the archive. An entry's own data is not bounded.

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;

/// Headers, long names, PAX records and sparse maps before one entry.
pub(crate) const MAX_ENTRY_METADATA: u64 = 4 << 20;

#[derive(Default)]
struct Meter {
    /// Bytes read so far.
    pos: Cell<u64>,
    /// Where reads stop, while armed.
    stop_at: Cell<Option<u64>>,
}

/// The tar stream, counted (see the module docs).
pub(crate) struct Counted<R> {
    inner: R,
    meter: Rc<Meter>,
}

/// What [`Entries`] needs of a [`Counted`] stream the archive owns.
pub(crate) struct MeterHandle(Rc<Meter>);

impl<R: Read> Counted<R> {
    pub(crate) fn new(inner: R) -> (Self, MeterHandle) {
        let meter = Rc::<Meter>::default();
        let handle = MeterHandle(meter.clone());
        (Counted { inner, meter }, handle)
    }
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let pos = self.meter.pos.get();
        let buf = match self.meter.stop_at.get() {
            None => buf,
            Some(stop) if pos >= stop => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the metadata of one entry (long names, PAX records, sparse map) is over {} MiB",
                        MAX_ENTRY_METADATA >> 20
                    ),
                ));
            }
            Some(stop) => {
                let room = usize::try_from(stop - pos).unwrap_or(usize::MAX);
                let n = buf.len().min(room);
                &mut buf[..n]
            }
        };
        let n = self.inner.read(buf)?;
        self.meter.pos.set(pos + n as u64);
        Ok(n)
    }
}

/// The entries of an archive over a [`Counted`] stream, metadata bounded.
pub(crate) struct Entries<'a, R: 'a + Read> {
    inner: tar::Entries<'a, Counted<R>>,
    meter: Rc<Meter>,
    /// Where the data of the entry handed out last ends (at most).
    data_end: u64,
}

impl<'a, R: Read> Entries<'a, R> {
    pub(crate) fn new(
        archive: &'a mut tar::Archive<Counted<R>>,
        meter: MeterHandle,
    ) -> io::Result<Self> {
        Ok(Entries {
            inner: archive.entries()?,
            meter: meter.0,
            data_end: 0,
        })
    }
}

impl<'a, R: Read> Iterator for Entries<'a, R> {
    type Item = io::Result<tar::Entry<'a, Counted<R>>>;

    fn next(&mut self) -> Option<Self::Item> {
        let pos = self.meter.pos.get();
        let stop = self.data_end.max(pos).saturating_add(MAX_ENTRY_METADATA);
        self.meter.stop_at.set(Some(stop));
        let item = self.inner.next();
        self.meter.stop_at.set(None);
        if let Some(Ok(entry)) = &item {
            // A sparse entry's archived size is the header's; size() is
            // the expanded one.
            let raw = if entry.header().entry_type().is_gnu_sparse() {
                entry.header().entry_size().unwrap_or(u64::MAX)
            } else {
                entry.size()
            };
            // Plus the padding to the next 512-byte block.
            self.data_end = self.meter.pos.get().saturating_add(raw).saturating_add(511);
        }
        item
    }
}
