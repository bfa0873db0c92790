//! Persistent, crash-safe metadata for crust.
//!
//! Records (pods, containers, images, image leases, runtime settings) live
//! in one redb database. redb commits are copy-on-write with a checksummed,
//! fsync'ed header switch, so a process killed mid-write leaves the previous
//! committed state, never a torn record; that is why it was chosen over
//! hand-written write-temp + fsync + rename files (one file per record would
//! cost an fsync of the file and of its directory per update and give no
//! multi-record transactions).
//!
//! Values are JSON: readable with any redb tool when debugging a node, and
//! tolerant of fields added in later versions (`#[serde(default)]`).
//!
//! An I/O error (a full disk) makes redb refuse every later operation
//! ("Previous I/O error occurred. Please close and re-open the database"),
//! even once the disk has room again. The store then closes and reopens
//! the database, and [`Store::health`] says why writes failed until
//! [`Store::probe`] finds that they work again, so the daemon reports
//! itself not ready instead of failing every call for good.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Serialize, de::DeserializeOwned};

/// The kinds of record crust stores, one redb table each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pod,
    Container,
    Image,
    /// A container's hold on the image layers its rootfs is made of, keyed
    /// by container ID (layers are freed only after the lease goes).
    Lease,
    /// Runtime-wide settings, e.g. the pod CIDR from UpdateRuntimeConfig.
    Meta,
}

impl Kind {
    fn table(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        TableDefinition::new(self.name())
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::Container => "containers",
            Kind::Image => "images",
            Kind::Lease => "leases",
            Kind::Meta => "meta",
        }
    }
}

/// A value stored under a key in the table of its kind.
pub trait Record: Serialize + DeserializeOwned {
    const KIND: Kind;
    fn key(&self) -> &str;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("metadata store {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: redb::DatabaseError,
    },
    #[error("metadata store: {0}")]
    Db(#[from] redb::Error),
    #[error("metadata store: record {kind}/{key} is not valid: {source}")]
    Decode {
        kind: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("metadata store: cannot encode {kind}/{key}: {source}")]
    Encode {
        kind: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    /// The database is closed after an I/O error and cannot be reopened
    /// yet.
    #[error("metadata store {path} is unavailable: {reason}")]
    Unavailable { path: String, reason: String },
}

impl Error {
    /// Another process has the database open (a running daemon).
    pub fn is_in_use(&self) -> bool {
        matches!(
            self,
            Error::Open {
                source: redb::DatabaseError::DatabaseAlreadyOpen,
                ..
            }
        )
    }

    /// An I/O error of the file (or redb's refusal after one): the
    /// database must be reopened.
    fn is_io(&self) -> bool {
        matches!(
            self,
            Error::Db(redb::Error::Io(_) | redb::Error::PreviousIo) | Error::Unavailable { .. }
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Small page cache: metadata is a few KiB per pod, and the daemon's idle RSS
/// budget is 10 MiB.
const CACHE_BYTES: usize = 2 << 20;

pub struct Store {
    path: PathBuf,
    /// None while closed after an I/O error (reopened on next use).
    db: RwLock<Option<Database>>,
    /// Why a write failed, until [`Store::probe`] succeeds.
    failure: Mutex<Option<String>>,
}

/// The key [`Store::probe`] writes in the [`Kind::Meta`] table.
const PROBE_KEY: &str = "store-probe";
/// What the probe writes: more than any usual record, so that it needs
/// room in the file as they do (a tiny write often fits in pages the file
/// has free while a real record does not).
const PROBE_BYTES: usize = 64 << 10;

impl Store {
    /// Opens (or creates) the database file, creating every table so reads
    /// never meet a missing one.
    pub fn open(path: &Path) -> Result<Self> {
        let db = open_db(path)?;
        let store = Store {
            path: path.to_path_buf(),
            db: RwLock::new(Some(db)),
            failure: Mutex::new(None),
        };
        store.write(|tx| {
            for kind in [
                Kind::Pod,
                Kind::Container,
                Kind::Image,
                Kind::Lease,
                Kind::Meta,
            ] {
                tx.txn.open_table(kind.table()).map_err(redb::Error::from)?;
            }
            Ok(())
        })?;
        Ok(store)
    }

    /// Ok while writes work; else why one failed, until [`Store::probe`]
    /// succeeds (other writes that succeed meanwhile, small ones that found
    /// room, do not count).
    pub fn health(&self) -> std::result::Result<(), String> {
        match &*self.failure.lock().unwrap_or_else(|e| e.into_inner()) {
            None => Ok(()),
            Some(why) => Err(why.clone()),
        }
    }

    /// Tries a write of [`PROBE_BYTES`] (reopening the database if
    /// needed); once one succeeds, [`Store::health`] is Ok again.
    pub fn probe(&self) -> Result<()> {
        let value = format!("\"{}\"", "p".repeat(PROBE_BYTES));
        self.write(|tx| {
            let mut table = tx
                .txn
                .open_table(Kind::Meta.table())
                .map_err(redb::Error::from)?;
            table
                .insert(PROBE_KEY, value.as_bytes())
                .map_err(redb::Error::from)?;
            Ok(())
        })?;
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    /// Runs `f` on the open database; an I/O error closes it, to be
    /// reopened by the next call.
    fn with_db<T>(&self, f: impl FnOnce(&Database) -> Result<T>) -> Result<T> {
        {
            let guard = self.db.read().unwrap_or_else(|e| e.into_inner());
            if let Some(db) = guard.as_ref() {
                let out = f(db);
                drop(guard);
                if let Err(e) = &out
                    && e.is_io()
                {
                    self.close();
                }
                return out;
            }
        }
        let mut guard = self.db.write().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            *guard = Some(open_db(&self.path).map_err(|e| Error::Unavailable {
                path: self.path.display().to_string(),
                reason: e.to_string(),
            })?);
        }
        let db = guard.as_ref().expect("just opened");
        let out = f(db);
        if let Err(e) = &out
            && e.is_io()
        {
            *guard = None;
        }
        out
    }

    /// Closes the database after an I/O error: redb refuses everything
    /// after one until it is closed and reopened.
    fn close(&self) {
        let mut guard = self.db.write().unwrap_or_else(|e| e.into_inner());
        *guard = None;
    }

    pub fn get<R: Record>(&self, key: &str) -> Result<Option<R>> {
        self.with_db(|db| {
            let txn = db.begin_read().map_err(redb::Error::from)?;
            let table = txn.open_table(R::KIND.table()).map_err(redb::Error::from)?;
            let Some(raw) = table.get(key).map_err(redb::Error::from)? else {
                return Ok(None);
            };
            decode::<R>(key, raw.value()).map(Some)
        })
    }

    pub fn list<R: Record>(&self) -> Result<Vec<R>> {
        self.with_db(|db| {
            let txn = db.begin_read().map_err(redb::Error::from)?;
            let table = txn.open_table(R::KIND.table()).map_err(redb::Error::from)?;
            let mut out = Vec::new();
            for entry in table.iter().map_err(redb::Error::from)? {
                let (k, v) = entry.map_err(redb::Error::from)?;
                out.push(decode::<R>(k.value(), v.value())?);
            }
            Ok(out)
        })
    }

    pub fn put<R: Record>(&self, record: &R) -> Result<()> {
        self.write(|tx| tx.put(record))
    }

    /// Deletes a record; returns whether it existed.
    pub fn delete<R: Record>(&self, key: &str) -> Result<bool> {
        self.write(|tx| tx.delete::<R>(key))
    }

    /// Puts a record in a commit that is not flushed by itself (no fsync):
    /// visible at once, durable with the store's next durable commit
    /// ([`Store::put`], [`Store::write`]); a crash before that loses it
    /// whole, never tears it. For a record whose loss costs nothing while
    /// nothing else has been done: the first step of a creation whose
    /// first effect is itself a durable commit.
    pub fn put_deferred<R: Record>(&self, record: &R) -> Result<()> {
        self.commit(false, |tx| tx.put(record))
    }

    /// Runs `f` in one write transaction: every change it makes is committed
    /// (durably) together, or none is if it fails.
    pub fn write<T>(&self, f: impl FnOnce(&mut Txn) -> Result<T>) -> Result<T> {
        self.commit(true, f)
    }

    fn commit<T>(&self, durable: bool, f: impl FnOnce(&mut Txn) -> Result<T>) -> Result<T> {
        let out = self.with_db(|db| {
            let mut txn = db.begin_write().map_err(redb::Error::from)?;
            if !durable {
                txn.set_durability(redb::Durability::None)
                    .map_err(redb::Error::from)?;
            }
            let mut tx = Txn { txn };
            let out = f(&mut tx)?;
            tx.txn.commit().map_err(redb::Error::from)?;
            Ok(out)
        });
        if let Err(e) = &out
            && e.is_io()
        {
            *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
        }
        out
    }
}

fn open_db(path: &Path) -> Result<Database> {
    Database::builder()
        .set_cache_size(CACHE_BYTES)
        .create(path)
        .map_err(|source| Error::Open {
            path: path.display().to_string(),
            source,
        })
}

/// A write transaction, see [`Store::write`].
pub struct Txn {
    txn: redb::WriteTransaction,
}

impl Txn {
    pub fn put<R: Record>(&mut self, record: &R) -> Result<()> {
        let key = record.key();
        let bytes = serde_json::to_vec(record).map_err(|source| Error::Encode {
            kind: R::KIND.name(),
            key: key.to_string(),
            source,
        })?;
        let mut table = self
            .txn
            .open_table(R::KIND.table())
            .map_err(redb::Error::from)?;
        table
            .insert(key, bytes.as_slice())
            .map_err(redb::Error::from)?;
        Ok(())
    }

    pub fn get<R: Record>(&mut self, key: &str) -> Result<Option<R>> {
        let table = self
            .txn
            .open_table(R::KIND.table())
            .map_err(redb::Error::from)?;
        let Some(raw) = table.get(key).map_err(redb::Error::from)? else {
            return Ok(None);
        };
        decode::<R>(key, raw.value()).map(Some)
    }

    /// The keys of `R` records that start with `prefix`, in order (a
    /// range read: no record is decoded).
    pub fn keys_with_prefix<R: Record>(&mut self, prefix: &str) -> Result<Vec<String>> {
        let table = self
            .txn
            .open_table(R::KIND.table())
            .map_err(redb::Error::from)?;
        let mut out = Vec::new();
        for entry in table.range(prefix..).map_err(redb::Error::from)? {
            let (k, _) = entry.map_err(redb::Error::from)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push(k.value().to_string());
        }
        Ok(out)
    }

    pub fn delete<R: Record>(&mut self, key: &str) -> Result<bool> {
        let mut table = self
            .txn
            .open_table(R::KIND.table())
            .map_err(redb::Error::from)?;
        let existed = table.remove(key).map_err(redb::Error::from)?.is_some();
        Ok(existed)
    }
}

fn decode<R: Record>(key: &str, raw: &[u8]) -> Result<R> {
    serde_json::from_slice(raw).map_err(|source| Error::Decode {
        kind: R::KIND.name(),
        key: key.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Pod {
        id: String,
        name: String,
        #[serde(default)]
        added_later: u32,
    }

    impl Record for Pod {
        const KIND: Kind = Kind::Pod;
        fn key(&self) -> &str {
            &self.id
        }
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Ctr {
        id: String,
    }

    impl Record for Ctr {
        const KIND: Kind = Kind::Container;
        fn key(&self) -> &str {
            &self.id
        }
    }

    fn pod(id: &str) -> Pod {
        Pod {
            id: id.into(),
            name: format!("name-{id}"),
            added_later: 0,
        }
    }

    #[test]
    fn put_get_list_delete_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.db")).unwrap();
        assert_eq!(store.get::<Pod>("a").unwrap(), None);
        store.put(&pod("a")).unwrap();
        store.put(&pod("b")).unwrap();
        assert_eq!(store.get::<Pod>("a").unwrap(), Some(pod("a")));
        assert_eq!(store.list::<Pod>().unwrap(), vec![pod("a"), pod("b")]);
        // Kinds are separate tables.
        assert!(store.list::<Ctr>().unwrap().is_empty());
        assert!(store.delete::<Pod>("a").unwrap());
        assert!(!store.delete::<Pod>("a").unwrap());
        assert_eq!(store.list::<Pod>().unwrap(), vec![pod("b")]);
    }

    #[test]
    fn keys_with_a_prefix_are_found_in_order_and_only_they() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.db")).unwrap();
        for id in ["ab", "abc/volume/0", "abc/volume/1", "abd", "b", "abc"] {
            store.put(&pod(id)).unwrap();
        }
        let keys = store
            .write(|tx| tx.keys_with_prefix::<Pod>("abc/"))
            .unwrap();
        assert_eq!(keys, vec!["abc/volume/0", "abc/volume/1"]);
        let none = store.write(|tx| tx.keys_with_prefix::<Pod>("x")).unwrap();
        assert!(none.is_empty());
        // Deleting what was found and another record commits together.
        store
            .write(|tx| {
                for k in tx.keys_with_prefix::<Pod>("abc")? {
                    tx.delete::<Pod>(&k)?;
                }
                tx.delete::<Pod>("b").map(drop)
            })
            .unwrap();
        let left: Vec<String> = store
            .list::<Pod>()
            .unwrap()
            .into_iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(left, vec!["ab", "abd"]);
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Hold {
        container: String,
    }

    impl Record for Hold {
        const KIND: Kind = Kind::Lease;
        fn key(&self) -> &str {
            &self.container
        }
    }

    #[test]
    fn leases_have_their_own_table() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.db")).unwrap();
        // Created at open: listing an empty kind works.
        assert!(store.list::<Hold>().unwrap().is_empty());
        let hold = Hold {
            container: "a".into(),
        };
        store.put(&hold).unwrap();
        store.put(&pod("a")).unwrap();
        assert_eq!(store.list::<Hold>().unwrap(), vec![hold]);
        assert!(store.delete::<Hold>("a").unwrap());
        assert_eq!(store.list::<Pod>().unwrap(), vec![pod("a")]);
        assert_eq!(Kind::Lease.name(), "leases");
    }

    #[test]
    fn a_database_open_elsewhere_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        let _first = Store::open(&path).unwrap();
        let Err(e) = Store::open(&path) else {
            panic!("opened twice")
        };
        assert!(e.is_in_use(), "{e}");
    }

    /// A deferred put is read back at once and is made durable by the next
    /// durable commit, whatever that one writes.
    #[test]
    fn a_deferred_put_is_visible_and_rides_the_next_durable_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        let store = Store::open(&path).unwrap();
        store.put_deferred(&pod("a")).unwrap();
        assert_eq!(store.get::<Pod>("a").unwrap(), Some(pod("a")));
        store
            .put(&Hold {
                container: "a".into(),
            })
            .unwrap();
        drop(store);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.get::<Pod>("a").unwrap(), Some(pod("a")));
        assert_eq!(store.list::<Hold>().unwrap().len(), 1);
    }

    #[test]
    fn records_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        Store::open(&path).unwrap().put(&pod("a")).unwrap();
        let store = Store::open(&path).unwrap();
        assert_eq!(store.get::<Pod>("a").unwrap(), Some(pod("a")));
    }

    #[test]
    fn failed_transaction_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.db")).unwrap();
        store.put(&pod("keep")).unwrap();
        let res: Result<()> = store.write(|tx| {
            tx.put(&pod("new"))?;
            tx.delete::<Pod>("keep")?;
            // A decode failure aborts the whole transaction.
            Err(Error::Decode {
                kind: "pods",
                key: "x".into(),
                source: serde_json::from_str::<u8>("x").unwrap_err(),
            })
        });
        assert!(res.is_err());
        assert_eq!(store.list::<Pod>().unwrap(), vec![pod("keep")]);
    }

    #[test]
    fn fields_added_later_default_when_reading_old_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.db")).unwrap();
        store
            .write(|tx| {
                let mut t = tx
                    .txn
                    .open_table(Kind::Pod.table())
                    .map_err(redb::Error::from)?;
                t.insert("old", br#"{"id":"old","name":"n"}"#.as_slice())
                    .map_err(redb::Error::from)?;
                Ok(())
            })
            .unwrap();
        let got = store.get::<Pod>("old").unwrap().unwrap();
        assert_eq!(got.added_later, 0);
    }

    #[test]
    fn corrupt_record_is_a_decode_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.db")).unwrap();
        store
            .write(|tx| {
                let mut t = tx
                    .txn
                    .open_table(Kind::Pod.table())
                    .map_err(redb::Error::from)?;
                t.insert("bad", b"{not json".as_slice())
                    .map_err(redb::Error::from)?;
                Ok(())
            })
            .unwrap();
        let err = store.get::<Pod>("bad").unwrap_err().to_string();
        assert!(err.contains("pods/bad"), "{err}");
    }
}
