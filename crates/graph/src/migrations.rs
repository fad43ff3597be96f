//! Schema migrations compiled into the binary, read with sqlx's own rules.
//!
//! `sqlx::migrate!` would do this, but it is a procedural macro: it builds sqlx, both database
//! drivers and SQLite's C source a second time, for the compiler's host, which was a large
//! part of a first build (docs/benchmarks.md, "The build a newcomer waits for"). Here each
//! crate lists its files with [`embedded_migrations!`], `include_str!` embeds them, and
//! [`EmbeddedMigrations::migrator`] parses names the way sqlx's directory reader does
//! (`<VERSION>_<DESCRIPTION>.sql`, checksums of the text), so databases migrated by either
//! agree. A test in each crate compares the list with its directory, so a file left out of the
//! list fails the suite.

use sqlx::error::BoxDynError;
use sqlx::migrate::{MigrateError, Migration, MigrationSource, MigrationType, Migrator};
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

/// Migration files by name (`0001_checkpoints.sql`) with their SQL, in any order.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedMigrations {
    files: &'static [(&'static str, &'static str)],
}

impl EmbeddedMigrations {
    /// The files, as [`embedded_migrations!`] lists them.
    pub const fn new(files: &'static [(&'static str, &'static str)]) -> Self {
        Self { files }
    }

    /// The migrations, sorted by version, as sqlx reads a directory of the same files.
    ///
    /// # Errors
    /// A file name without a numeric version or a `.sql` ending.
    pub fn migrations(&self) -> Result<Vec<Migration>, BoxDynError> {
        let mut out = Vec::with_capacity(self.files.len());
        for (name, sql) in self.files {
            let Some((version, rest)) = name.split_once('_').filter(|(_, rest)| rest.ends_with(".sql")) else {
                return Err(bad_name(name));
            };
            let version: i64 = version.parse().map_err(|_| bad_name(name))?;
            let kind = MigrationType::from_filename(rest);
            let description = rest.trim_end_matches(kind.suffix()).replace('_', " ");
            let no_tx = sql.starts_with("-- no-transaction");
            out.push(Migration::new(version, Cow::Owned(description), kind, Cow::Borrowed(*sql), no_tx));
        }
        out.sort_by_key(|m| m.version);
        Ok(out)
    }

    /// A migrator over these migrations (sqlx's defaults: locking, missing versions refused).
    ///
    /// # Errors
    /// As [`migrations`](Self::migrations), as [`MigrateError::Source`].
    pub async fn migrator(self) -> Result<Migrator, MigrateError> {
        Migrator::new(self).await
    }
}

fn bad_name(name: &str) -> BoxDynError {
    format!("migration file '{name}' is not named <VERSION>_<DESCRIPTION>.sql").into()
}

impl<'s> MigrationSource<'s> for EmbeddedMigrations {
    fn resolve(self) -> Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send + 's>> {
        Box::pin(async move { self.migrations() })
    }
}

/// [`EmbeddedMigrations`] of files in a directory of the calling crate:
/// `embedded_migrations!("migrations/sqlite", ["0001_checkpoints.sql", …])`.
#[macro_export]
macro_rules! embedded_migrations {
    ($dir:literal, [$($file:literal),+ $(,)?]) => {
        $crate::migrations::EmbeddedMigrations::new(&[
            $(($file, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $dir, "/", $file)))),+
        ])
    };
}

/// Checks that `embedded` holds exactly what sqlx reads from `dir` (the same versions,
/// descriptions, kinds, checksums and transaction choices). For the crates' tests.
///
/// # Panics
/// When they differ, naming the first difference.
pub async fn assert_same_as_directory(embedded: EmbeddedMigrations, dir: &std::path::Path) {
    let read = Migrator::new(dir).await.unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    let ours = embedded.migrator().await.unwrap_or_else(|e| panic!("embedded migrations: {e}"));
    let key = |m: &Migration| (m.version, m.description.to_string(), m.migration_type, m.checksum.to_vec(), m.no_tx);
    let read: Vec<_> = read.iter().map(key).collect();
    let ours: Vec<_> = ours.iter().map(key).collect();
    let versions = |v: &[(i64, String, MigrationType, Vec<u8>, bool)]| v.iter().map(|m| m.0).collect::<Vec<_>>();
    assert_eq!(versions(&ours), versions(&read), "the embedded list and {} hold different files", dir.display());
    assert!(ours == read, "an embedded migration differs from its file in {}", dir.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_as_sqlx_reads_them() {
        let m = EmbeddedMigrations::new(&[
            ("0002_graph_definitions.sql", "-- no-transaction\nSELECT 2;"),
            ("0001_check_points.up.sql", "SELECT 1;"),
        ])
        .migrations()
        .unwrap();
        assert_eq!(m.iter().map(|m| m.version).collect::<Vec<_>>(), [1, 2], "sorted by version");
        assert_eq!(m[0].description, "check points");
        assert_eq!(m[0].migration_type, MigrationType::ReversibleUp);
        assert!(!m[0].no_tx);
        assert_eq!(m[1].description, "graph definitions");
        assert!(m[1].no_tx);
        assert_eq!(
            m[1].checksum,
            Migration::new(2, "x".into(), MigrationType::Simple, "-- no-transaction\nSELECT 2;".into(), true).checksum
        );
    }

    #[test]
    fn a_file_not_named_as_a_migration_is_refused_by_name() {
        const NAMED_WRONG: [&[(&str, &str)]; 3] =
            [&[("checkpoints.sql", "")], &[("x_checkpoints.sql", "")], &[("0001_checkpoints.txt", "")]];
        for files in NAMED_WRONG {
            let err = EmbeddedMigrations::new(files).migrations().unwrap_err().to_string();
            assert!(err.contains(files[0].0), "{err}");
        }
    }

    #[tokio::test]
    async fn the_runtime_crates_lists_hold_every_file_of_their_directories() {
        let dir = |d: &str| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(d);
        assert_same_as_directory(crate::checkpoint::SQLITE_MIGRATIONS, &dir("migrations/sqlite")).await;
        assert_same_as_directory(crate::checkpoint::POSTGRES_MIGRATIONS, &dir("migrations/postgres")).await;
    }
}
