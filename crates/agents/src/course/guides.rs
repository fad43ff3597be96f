//! The teaching guides (guías docentes) `get_guia` reads: a JSON document per subject and
//! tenant, in the embedded SQLite file by default or in PostgreSQL (`jsonb`) when the service
//! runs on it. `toolgraph guides import` fills it, one upsert per guide, so importing the same
//! files twice changes nothing.

use serde_json::{Map, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;
use toolgraph_graph::PgDatabase;
use toolgraph_graph::SqliteDatabase;

/// The largest guide accepted: a real one is 20–60 KB of JSON.
pub const MAX_GUIDE_BYTES: usize = 1024 * 1024;

/// The sections a guide may hold and `get_guia` may be asked for (its `key`), with the shape
/// each must have. The first seven are the course tutor's `SubjectDataKey`; the rest are the
/// other sections a university guide has.
pub const SECTIONS: [&str; 14] = [
    "competencias",
    "objetivos",
    "breve_descripción_de_contenidos",
    "metodología_docente",
    "sistema_de_evaluación",
    "bibliografía_fundamental",
    "profesorado",
    "prerrequisitos",
    "resultados_de_aprendizaje",
    "temario",
    "bibliografía_complementaria",
    "actividades_formativas",
    "tutorías",
    "enlaces_recomendados",
];

/// A guide that passed the checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Guide {
    /// Its subject identifier (`iv`): what the conversation's `asignatura` names.
    pub subject: String,
    /// The whole document.
    pub doc: Value,
}

/// What is wrong with a guide or the store.
#[derive(Debug, thiserror::Error)]
pub enum GuideError {
    /// The document breaks a rule; `field` names where.
    #[error("{field}: {message}")]
    Invalid {
        /// The field (a dot path), or `(document)`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The database failed.
    #[error("the guide store failed: {0}")]
    Store(String),
}

fn invalid(field: &str, message: impl Into<String>) -> GuideError {
    GuideError::Invalid { field: field.to_owned(), message: message.into() }
}

impl Guide {
    /// Checks `doc`: an object with a `subject` identifier (1–64 of a-z, 0-9, `-`, `_`), the
    /// subject's name in `asignatura`, optional `grado`, `curso` and `url` (http/https) strings,
    /// and each known section present as text, a list or an object.
    ///
    /// # Errors
    /// [`GuideError::Invalid`] naming the first field that breaks a rule.
    pub fn from_json(doc: Value) -> Result<Self, GuideError> {
        let Value::Object(fields) = &doc else { return Err(invalid("(document)", "a guide is a JSON object")) };
        let text = |name: &str, required: bool| -> Result<Option<&str>, GuideError> {
            match fields.get(name) {
                Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.as_str())),
                Some(Value::String(_)) => Err(invalid(name, "must not be empty")),
                Some(_) => Err(invalid(name, "must be a string")),
                None if required => Err(invalid(name, "is required")),
                None => Ok(None),
            }
        };
        let subject = text("subject", true)?.unwrap_or_default().to_owned();
        let valid = subject.len() <= 64
            && subject.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !valid {
            return Err(invalid("subject", format!("'{subject}' is not an identifier (1-64 of a-z, 0-9, - and _)")));
        }
        text("asignatura", true)?;
        text("grado", false)?;
        text("curso", false)?;
        if let Some(url) = text("url", false)?
            && !url::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "http" | "https"))
        {
            return Err(invalid("url", format!("'{url}' is not an http(s) URL")));
        }
        for section in SECTIONS {
            match fields.get(section) {
                None | Some(Value::String(_) | Value::Array(_) | Value::Object(_)) => {}
                Some(_) => return Err(invalid(section, "must be text, a list or an object")),
            }
        }
        Ok(Self { subject, doc })
    }

    /// What `get_guia` answers without a key: who and what the subject is.
    pub fn summary(doc: &Value) -> Value {
        let field = |k: &str| doc.get(k).cloned().unwrap_or(Value::Null);
        let mut out = Map::new();
        for key in ["subject", "asignatura", "grado", "curso", "url"] {
            out.insert(key.into(), field(key));
        }
        out.insert("brief_description".into(), field("breve_descripción_de_contenidos"));
        Value::Object(out)
    }
}

/// The value at dot path `path` of `doc` (`competencias.generales`), if there is one.
///
/// A part that names no key exactly matches the one key equal to it without accents and case:
/// small models write `bibliografia_fundamental` for `bibliografía_fundamental`.
pub fn navigate<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(doc, |at, part| match at {
        Value::Object(m) => m.get(part).or_else(|| {
            let wanted = fold(part);
            let mut close = m.iter().filter(|(k, _)| fold(k) == wanted).map(|(_, v)| v);
            // Two keys that fold alike are ambiguous: neither is chosen.
            close.next().filter(|_| close.next().is_none())
        }),
        Value::Array(items) => part.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

/// `key` lower-cased, with the accents of Spanish (and the other Latin-script languages the
/// guides are written in) removed, and spaces as underscores.
pub(crate) fn fold(key: &str) -> String {
    key.trim()
        .chars()
        .flat_map(char::to_lowercase)
        .map(|c| match c {
            ' ' | '-' => '_',
            other => toolgraph_rag::search::grounding::fold_accent(other),
        })
        .collect()
}

/// What an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upserted {
    /// The subject had no guide.
    Inserted,
    /// The subject's guide changed.
    Updated,
    /// The same guide was there already.
    Unchanged,
}

/// Where the guides live.
#[derive(Clone, Debug)]
pub enum GuideStore {
    /// A SQLite file (`<data_dir>/guides.db`); JSON as text.
    Sqlite(SqliteDatabase),
    /// PostgreSQL; JSON as `jsonb`.
    Postgres(PgDatabase),
}

const SQLITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS guides (
    tenant TEXT NOT NULL, subject TEXT NOT NULL, doc TEXT NOT NULL CHECK (json_valid(doc)),
    updated_at INTEGER NOT NULL, PRIMARY KEY (tenant, subject))";

const POSTGRES_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS toolgraph_guides (
    tenant TEXT NOT NULL, subject TEXT NOT NULL, doc JSONB NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (tenant, subject))";

fn store_error(e: impl std::fmt::Display) -> GuideError {
    GuideError::Store(e.to_string())
}

fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

impl GuideStore {
    /// The SQLite file at `path` (created if needed).
    ///
    /// # Errors
    /// When the file cannot be opened or its table made.
    pub async fn open_sqlite(path: &Path) -> Result<Self, GuideError> {
        let db = SqliteDatabase::open(path).await.map_err(store_error)?;
        db.call(|c| c.execute(SQLITE_SCHEMA, [])).await.map_err(store_error)?.map_err(store_error)?;
        Ok(Self::Sqlite(db))
    }

    /// The PostgreSQL database at `url` (its table made if needed).
    ///
    /// # Errors
    /// When it cannot be reached or the table made.
    pub async fn open_postgres(url: &str) -> Result<Self, GuideError> {
        Self::open_postgres_with(PgConnectOptions::from_str(url).map_err(store_error)?).await
    }

    /// [`GuideStore::open_postgres`] with explicit options (a `search_path`, say).
    ///
    /// # Errors
    /// See [`GuideStore::open_postgres`].
    pub async fn open_postgres_with(options: PgConnectOptions) -> Result<Self, GuideError> {
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(store_error)?;
        Self::open_postgres_database(PgDatabase::direct(pool)).await
    }

    /// The guides in `db` (possibly behind a pooler in transaction mode), the table made if
    /// needed.
    ///
    /// # Errors
    /// When the table cannot be made.
    pub async fn open_postgres_database(db: PgDatabase) -> Result<Self, GuideError> {
        // The simple query protocol: no statement to prepare, whatever the pooling.
        sqlx::raw_sql(POSTGRES_SCHEMA).execute(db.pool()).await.map_err(store_error)?;
        Ok(Self::Postgres(db))
    }

    /// Stores `guide` for `tenant`, replacing the subject's previous guide.
    ///
    /// # Errors
    /// When the database fails.
    pub async fn upsert(&self, tenant: &str, guide: &Guide) -> Result<Upserted, GuideError> {
        let before = self.get(tenant, &guide.subject).await?;
        if before.as_ref() == Some(&guide.doc) {
            return Ok(Upserted::Unchanged);
        }
        let (tenant, subject, text) = (tenant.to_owned(), guide.subject.clone(), guide.doc.to_string());
        match self {
            Self::Sqlite(db) => {
                db.call(move |c| {
                    c.execute(
                        "INSERT INTO guides (tenant, subject, doc, updated_at) VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (tenant, subject) DO UPDATE SET doc = excluded.doc, updated_at = excluded.updated_at",
                        rusqlite::params![tenant, subject, text, now_secs()],
                    )
                })
                .await
                .map_err(store_error)?
                .map_err(store_error)?;
            }
            Self::Postgres(db) => {
                let mut s = db.session().await.map_err(store_error)?;
                sqlx::query(
                    "INSERT INTO toolgraph_guides (tenant, subject, doc) VALUES ($1, $2, $3::jsonb)
                     ON CONFLICT (tenant, subject) DO UPDATE SET doc = excluded.doc, updated_at = now()",
                )
                .bind(tenant)
                .bind(subject)
                .bind(text)
                .persistent(db.persistent())
                .execute(&mut *s)
                .await
                .map_err(store_error)?;
                s.finish().await.map_err(store_error)?;
            }
        }
        Ok(if before.is_some() { Upserted::Updated } else { Upserted::Inserted })
    }

    /// `tenant`'s guide of `subject`, if there is one.
    ///
    /// # Errors
    /// When the database fails.
    pub async fn get(&self, tenant: &str, subject: &str) -> Result<Option<Value>, GuideError> {
        let (tenant, subject) = (tenant.to_owned(), subject.to_owned());
        let text: Option<String> = match self {
            Self::Sqlite(db) => db
                .call(move |c| {
                    use rusqlite::OptionalExtension;
                    c.query_row(
                        "SELECT doc FROM guides WHERE tenant = ?1 AND subject = ?2",
                        rusqlite::params![tenant, subject],
                        |row| row.get(0),
                    )
                    .optional()
                })
                .await
                .map_err(store_error)?
                .map_err(store_error)?,
            Self::Postgres(db) => {
                let mut s = db.session().await.map_err(store_error)?;
                let text =
                    sqlx::query_scalar("SELECT doc::text FROM toolgraph_guides WHERE tenant = $1 AND subject = $2")
                        .bind(tenant)
                        .bind(subject)
                        .persistent(db.persistent())
                        .fetch_optional(&mut *s)
                        .await
                        .map_err(store_error)?;
                s.finish().await.map_err(store_error)?;
                text
            }
        };
        text.map(|t| serde_json::from_str(&t).map_err(store_error)).transpose()
    }

    /// `tenant`'s subjects with a guide, in order.
    ///
    /// # Errors
    /// When the database fails.
    pub async fn subjects(&self, tenant: &str) -> Result<Vec<String>, GuideError> {
        let tenant = tenant.to_owned();
        match self {
            Self::Sqlite(db) => db
                .call(move |c| {
                    let mut st = c.prepare("SELECT subject FROM guides WHERE tenant = ?1 ORDER BY subject")?;
                    let rows = st.query_map([tenant], |row| row.get(0))?;
                    rows.collect::<Result<Vec<String>, _>>()
                })
                .await
                .map_err(store_error)?
                .map_err(store_error),
            Self::Postgres(db) => {
                let mut s = db.session().await.map_err(store_error)?;
                let subjects =
                    sqlx::query_scalar("SELECT subject FROM toolgraph_guides WHERE tenant = $1 ORDER BY subject")
                        .bind(tenant)
                        .persistent(db.persistent())
                        .fetch_all(&mut *s)
                        .await
                        .map_err(store_error)?;
                s.finish().await.map_err(store_error)?;
                Ok(subjects)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn guide() -> Value {
        json!({
            "subject": "iv", "asignatura": "Infraestructura Virtual", "grado": "Grado en Ingeniería Informática",
            "curso": "4º", "url": "https://grados.ugr.es/informatica/iv",
            "breve_descripción_de_contenidos": ["Contenedores", "Integración continua"],
            "competencias": {"generales": ["CG1", "CG2"], "específicas": ["CE1"]}
        })
    }

    #[test]
    fn a_guide_is_checked_field_by_field() {
        assert!(Guide::from_json(guide()).is_ok());
        let field = |patch: Value| {
            let mut doc = guide();
            for (k, v) in patch.as_object().unwrap() {
                doc[k] = v.clone();
            }
            match Guide::from_json(doc) {
                Err(GuideError::Invalid { field, .. }) => field,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(field(json!({"subject": "Infra Virtual"})), "subject");
        assert_eq!(field(json!({"subject": 3})), "subject");
        assert_eq!(field(json!({"asignatura": ""})), "asignatura");
        assert_eq!(field(json!({"url": "ftp://x"})), "url");
        assert_eq!(field(json!({"competencias": 7})), "competencias");
        let Err(GuideError::Invalid { field, .. }) = Guide::from_json(json!([1])) else { panic!() };
        assert_eq!(field, "(document)");
    }

    #[test]
    fn summary_and_dot_paths() {
        let doc = guide();
        let summary = Guide::summary(&doc);
        assert_eq!(summary["subject"], "iv");
        assert_eq!(summary["brief_description"], json!(["Contenedores", "Integración continua"]));
        assert_eq!(navigate(&doc, "competencias.generales"), Some(&json!(["CG1", "CG2"])));
        assert_eq!(navigate(&doc, "competencias.generales.1"), Some(&json!("CG2")));
        assert_eq!(navigate(&doc, "competencias.transversales"), None);
        assert_eq!(navigate(&doc, "curso.x"), None);
        assert_eq!(navigate(&doc, "Competencias.Generales.0"), Some(&json!("CG1")));
        let accented = json!({"bibliografía_fundamental": ["B1"], "metodología docente": "M"});
        assert_eq!(navigate(&accented, "bibliografia_fundamental"), Some(&json!(["B1"])));
        assert_eq!(navigate(&accented, "metodologia_docente"), Some(&json!("M")));
        let ambiguous = json!({"año": 1, "ano": 2, "Ano": 3});
        assert_eq!(navigate(&ambiguous, "ano"), Some(&json!(2)), "an exact key wins");
        assert_eq!(navigate(&ambiguous, "AÑO"), None, "keys that fold alike are ambiguous");
    }

    #[tokio::test]
    async fn upserts_are_idempotent_and_per_tenant() {
        let dir = tempfile::tempdir().unwrap();
        upserts_on(&GuideStore::open_sqlite(&dir.path().join("guides.db")).await.unwrap()).await;
    }

    /// The same behind PgBouncer in transaction mode, one server connection for all clients.
    #[tokio::test]
    async fn upserts_work_behind_a_transaction_pooler() {
        use toolgraph_graph::PgPooling;
        let Some(pooler) = toolgraph_testkit::pgbouncer::TransactionPooler::start(1).await else { return };
        let options = |url: &str| PgConnectOptions::from_str(url).unwrap();
        let pool = PgPoolOptions::new().max_connections(4).connect_with(options(&pooler.pooled_url())).await.unwrap();
        let db = PgDatabase::new(pool, PgPooling::Transaction, Some(options(&pooler.direct_url())));
        let store = GuideStore::open_postgres_database(db).await.unwrap();
        upserts_on(&store).await;
        // Concurrent readers: several client connections on the one server connection.
        let reads = (0..8).map(|_| store.get("ugr", "iv"));
        for read in futures::future::join_all(reads).await {
            assert_eq!(read.unwrap().unwrap()["curso"], "3º");
        }
    }

    async fn upserts_on(store: &GuideStore) {
        let g = Guide::from_json(guide()).unwrap();
        assert_eq!(store.upsert("ugr", &g).await.unwrap(), Upserted::Inserted);
        assert_eq!(store.upsert("ugr", &g).await.unwrap(), Upserted::Unchanged);
        let mut changed = g.clone();
        changed.doc["curso"] = json!("3º");
        assert_eq!(store.upsert("ugr", &changed).await.unwrap(), Upserted::Updated);
        assert_eq!(store.get("ugr", "iv").await.unwrap().unwrap()["curso"], "3º");
        assert_eq!(store.get("other", "iv").await.unwrap(), None);
        assert_eq!(store.subjects("ugr").await.unwrap(), ["iv"]);
    }
}
