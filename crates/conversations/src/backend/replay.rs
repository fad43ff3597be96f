//! Replay protection of signed requests: where a verifier records the nonces it accepted, so
//! each is accepted once within its window ([`super::signing::HmacVerifier`]).
//!
//! Owns: the [`ReplayStore`] trait and its two stores — [`MemoryReplayStore`], in this process
//! (one replica, tests), and [`PostgresReplayStore`], the `signature_nonces` table that replicas
//! share, so a request accepted by one replica is a replay to the others and to a restarted one.
//!
//! A nonce is kept until its request's timestamp leaves the window (`expires_at`): after that the
//! request is refused as stale, so dropping it reopens nothing. A store never forgets a nonce
//! early to make room — forgetting is what would let a captured request through again — so the
//! memory store, when full of live nonces, refuses new requests (the caller answers 503 and the
//! signer retries) until some expire.

use crate::StoreError;
use async_trait::async_trait;
use sha2::{Digest, Sha256};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use toolgraph_graph::PgDatabase;

/// Why a nonce could not be claimed: the request may be good, but is not accepted unchecked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The memory store holds its capacity of live nonces.
    #[error("full ({0} requests within the window); try again")]
    Full(usize),
    /// The shared store did not answer.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// Where accepted nonces are kept until they expire.
#[async_trait]
pub trait ReplayStore: Send + Sync {
    /// Records `key` until `expires_at` (Unix seconds): `true` when it was not there (the
    /// request is new), `false` when it was (a replay). `now` is the verifier's clock, for
    /// dropping expired keys.
    ///
    /// # Errors
    /// When the key cannot be recorded (full, or the database is unreachable).
    async fn claim(&self, key: &str, expires_at: i64, now: i64) -> Result<bool, ReplayError>;
}

/// Live nonces a [`MemoryReplayStore::default`] holds: about 25 MB when full (25.3 MB measured
/// for 250,000 claims, 2026-11-28), and room for ~800 signed requests a second kept for the
/// 300 s of their window.
pub const DEFAULT_MEMORY_CAPACITY: usize = 250_000;

/// Nonces in this process: one replica's, lost on restart (a restarted verifier accepts a request
/// captured before it within its window; replicas share a [`PostgresReplayStore`] instead).
#[derive(Debug)]
pub struct MemoryReplayStore {
    capacity: usize,
    seen: Mutex<Seen>,
}

/// Keys by a 128-bit digest (a fixed 16 bytes whatever the nonce; a collision is a 2^-64 event
/// at 2^32 keys), and their expiries in order, soonest first.
#[derive(Debug, Default)]
struct Seen {
    expiry: HashMap<u128, i64>,
    by_expiry: BinaryHeap<Reverse<(i64, u128)>>,
}

impl Default for MemoryReplayStore {
    fn default() -> Self {
        Self::new(DEFAULT_MEMORY_CAPACITY)
    }
}

impl MemoryReplayStore {
    /// A store holding at most `capacity` live nonces (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), seen: Mutex::new(Seen::default()) }
    }

    /// Live nonces held (expired ones are dropped on the next claim).
    pub fn len(&self) -> usize {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).expiry.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn digest128(key: &str) -> u128 {
    let d = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&d[..16]);
    u128::from_le_bytes(first)
}

#[async_trait]
impl ReplayStore for MemoryReplayStore {
    async fn claim(&self, key: &str, expires_at: i64, now: i64) -> Result<bool, ReplayError> {
        let id = digest128(key);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(&Reverse((expiry, old))) = seen.by_expiry.peek() {
            if expiry >= now {
                break;
            }
            seen.by_expiry.pop();
            seen.expiry.remove(&old);
        }
        if seen.expiry.contains_key(&id) {
            return Ok(false);
        }
        if seen.expiry.len() >= self.capacity {
            return Err(ReplayError::Full(self.capacity));
        }
        seen.expiry.insert(id, expires_at);
        seen.by_expiry.push(Reverse((expires_at, id)));
        Ok(true)
    }
}

/// How often one process deletes expired nonces, in seconds.
const PRUNE_EVERY: i64 = 60;

/// How long past its expiry a nonce is kept anyway, in seconds: replicas' clocks differ a
/// little, and one running ahead must not drop a nonce another still needs.
const PRUNE_GRACE: i64 = 60;

/// Nonces in PostgreSQL (`signature_nonces`), shared by every replica on the database: a claim is
/// one `INSERT … ON CONFLICT DO NOTHING`, which the primary key makes atomic across replicas.
/// Works behind a transaction pooler as the other stores do ([`PgDatabase`]).
#[derive(Debug)]
pub struct PostgresReplayStore {
    db: PgDatabase,
    /// When this process last deleted expired nonces (Unix seconds).
    pruned_at: AtomicI64,
}

impl PostgresReplayStore {
    /// The store over `db`, migrated with the conversation store's migrations (which create its
    /// table).
    ///
    /// # Errors
    /// When the migrations fail.
    pub async fn open(db: PgDatabase) -> Result<Self, StoreError> {
        let m = crate::postgres_migrator().await?;
        db.migrate(&m).await.map_err(|e| StoreError(format!("migration failed: {e}")))?;
        Ok(Self { db, pruned_at: AtomicI64::new(0) })
    }

    async fn try_claim(&self, key: &str, expires_at: i64, now: i64) -> Result<bool, sqlx::Error> {
        let mut s = self.db.session().await?;
        let last = self.pruned_at.load(Ordering::Relaxed);
        // One claim a minute per process also drops what expired; the index keeps it short.
        if now - last >= PRUNE_EVERY
            && self.pruned_at.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            sqlx::query("DELETE FROM signature_nonces WHERE expires_at < $1")
                .bind(now - PRUNE_GRACE)
                .persistent(self.db.persistent())
                .execute(&mut *s)
                .await?;
        }
        let inserted = sqlx::query(
            "INSERT INTO signature_nonces (nonce, expires_at) VALUES ($1, $2) ON CONFLICT (nonce) DO NOTHING",
        )
        .bind(key)
        .bind(expires_at)
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?
        .rows_affected();
        s.finish().await?;
        Ok(inserted == 1)
    }
}

#[async_trait]
impl ReplayStore for PostgresReplayStore {
    async fn claim(&self, key: &str, expires_at: i64, now: i64) -> Result<bool, ReplayError> {
        self.try_claim(key, expires_at, now).await.map_err(|e| {
            tracing::warn!(error = %e, "cannot record a signed request's nonce");
            ReplayError::Unavailable(e.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_memory_store_refuses_new_nonces_and_still_knows_the_old() {
        let store = MemoryReplayStore::new(2);
        let now = 1_000;
        assert_eq!(store.claim("a", now + 300, now).await, Ok(true));
        assert_eq!(store.claim("b", now + 300, now).await, Ok(true));
        assert_eq!(store.claim("c", now + 300, now).await, Err(ReplayError::Full(2)), "full: refused, not forgotten");
        assert_eq!(store.claim("a", now + 300, now + 10).await, Ok(false), "the first is still a replay");
        // Once they expire, there is room again, and the expired key is new (its request is
        // stale by then, which the verifier refuses before asking).
        assert_eq!(store.claim("c", now + 700, now + 301).await, Ok(true));
        assert_eq!(store.len(), 1);
        assert_eq!(store.claim("a", now + 700, now + 301).await, Ok(true));
    }
}
