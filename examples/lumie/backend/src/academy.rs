//! The academy's data: its tenants and staff, one SQLite file per tenant (students, classes,
//! attendance, payments, announcements, the messages and tasks the assistant's approved
//! actions made), created and filled with sample data on first start.
//!
//! A database per tenant is this backend's row-level security: a tenant's query runs on its
//! own file, opened read-only, so no SQL text can reach another tenant's rows.

use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use toolgraph_tools::ToolRegistry;

/// One academy using the assistant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant {
    /// The numeric id the service sends as `tenantId`.
    pub id: i64,
    /// The slug the service sends as `tenantSlug` and `X-Tenant-Slug`.
    pub slug: &'static str,
    /// Display name.
    pub name: &'static str,
}

/// The academies this backend serves.
pub const TENANTS: &[Tenant] = &[
    Tenant { id: 1, slug: "demo", name: "Hanbit Academy" },
    Tenant { id: 2, slug: "north", name: "North Star Academy" },
];

/// Staff who may use the assistant: `(userId, tenantId, name)`.
pub const STAFF: &[(i64, i64, &str)] = &[(1, 1, "Park Jiwoo"), (3, 1, "Seo Hana"), (2, 2, "Ana Ruiz")];

/// The description of a tenant's tables the model gets in its system prompt
/// (`GET /internal/chatbot/schema`). A test checks it names every table and column.
pub const SCHEMA_DESCRIPTION: &str = "\
SQLite database of one academy. Dates are 'YYYY-MM-DD' text, times 'YYYY-MM-DD HH:MM:SS' (UTC); \
use date('now') for today. Amounts are whole units of the academy's currency.
- classes(id, name such as '5A', teacher, schedule, monthly_fee)
- students(id, name, class_id -> classes.id, phone, parent_name, parent_phone, parent_telegram, enrolled_on)
- attendance(student_id -> students.id, class_date, present: 1 or 0)
- payments(id, student_id -> students.id, month 'YYYY-MM', amount, paid_on: NULL while unpaid)
- announcements(id, title, content, published_at, published_by)
- messages_sent(id, channel 'sms' or 'telegram', recipient_name, address, body, queued_at)
- tasks(id, title, due_at, assignee, created_at)";

const TABLES: &str = "
CREATE TABLE IF NOT EXISTS classes (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE COLLATE NOCASE, teacher TEXT NOT NULL,
    schedule TEXT NOT NULL, monthly_fee INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS students (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL COLLATE NOCASE, class_id INTEGER NOT NULL REFERENCES classes(id),
    phone TEXT, parent_name TEXT NOT NULL, parent_phone TEXT NOT NULL, parent_telegram TEXT,
    enrolled_on TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS attendance (
    student_id INTEGER NOT NULL REFERENCES students(id), class_date TEXT NOT NULL,
    present INTEGER NOT NULL CHECK (present IN (0, 1)), PRIMARY KEY (student_id, class_date));
CREATE TABLE IF NOT EXISTS payments (
    id INTEGER PRIMARY KEY, student_id INTEGER NOT NULL REFERENCES students(id), month TEXT NOT NULL,
    amount INTEGER NOT NULL, paid_on TEXT);
CREATE TABLE IF NOT EXISTS announcements (
    id INTEGER PRIMARY KEY, title TEXT NOT NULL, content TEXT NOT NULL, published_at TEXT NOT NULL,
    published_by INTEGER);
CREATE TABLE IF NOT EXISTS messages_sent (
    id INTEGER PRIMARY KEY, channel TEXT NOT NULL CHECK (channel IN ('sms', 'telegram')),
    recipient_name TEXT NOT NULL, address TEXT NOT NULL, body TEXT NOT NULL, queued_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    id INTEGER PRIMARY KEY, title TEXT NOT NULL, due_at TEXT NOT NULL, assignee TEXT,
    created_at TEXT NOT NULL);
-- One row per action the assistant ran, so a repeated call (same conversation and call id)
-- answers the first result instead of acting twice.
CREATE TABLE IF NOT EXISTS chatbot_actions (
    conversation_id INTEGER NOT NULL, call_id TEXT NOT NULL, tool TEXT NOT NULL, result TEXT NOT NULL,
    PRIMARY KEY (conversation_id, call_id));
";

/// Attendance for the last ten days and payments for last month (all paid) and this month (some
/// not yet), relative to the day of the first start.
const ACTIVITY: &str = "
INSERT INTO attendance (student_id, class_date, present)
WITH RECURSIVE d(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM d WHERE n < 10)
SELECT s.id, date('now', '-' || d.n || ' days'), CASE WHEN (s.id * 7 + d.n) % 6 = 0 THEN 0 ELSE 1 END
FROM students s, d;
INSERT INTO payments (student_id, month, amount, paid_on)
SELECT s.id, strftime('%Y-%m', 'now', 'start of month', '-1 month'), c.monthly_fee,
       date('now', 'start of month', '-1 month', '+4 days')
FROM students s JOIN classes c ON c.id = s.class_id;
INSERT INTO payments (student_id, month, amount, paid_on)
SELECT s.id, strftime('%Y-%m', 'now'), c.monthly_fee,
       CASE WHEN s.id % 4 = 3 THEN NULL ELSE min(date('now'), date('now', 'start of month', '+2 days')) END
FROM students s JOIN classes c ON c.id = s.class_id;
";

const DEMO_SAMPLE: &str = "
INSERT INTO classes (id, name, teacher, schedule, monthly_fee) VALUES
 (1, '5A', 'Choi Yuna', 'Mon, Wed 16:00-17:30', 250000),
 (2, '5B', 'Jung Hoseok', 'Tue, Thu 16:00-17:30', 250000),
 (3, '6A', 'Kang Mina', 'Mon, Wed, Fri 18:00-19:30', 300000);
INSERT INTO students (id, name, class_id, phone, parent_name, parent_phone, parent_telegram, enrolled_on) VALUES
 (1, 'Kim Minjun', 1, '+821020000001', 'Kim Soyeon', '+821030000001', '@kimsoyeon', '2025-03-02'),
 (2, 'Lee Seoyeon', 1, NULL, 'Lee Junho', '+821030000002', NULL, '2025-03-02'),
 (3, 'Park Doyun', 1, '+821020000003', 'Park Eunji', '+821030000003', '@park_eunji', '2025-09-01'),
 (4, 'Choi Hayun', 1, NULL, 'Choi Dongwook', '+821030000004', '@choidw', '2026-03-03'),
 (5, 'Jung Siwoo', 2, '+821020000005', 'Jung Mirae', '+821030000005', NULL, '2025-03-02'),
 (6, 'Kang Jiho', 2, NULL, 'Kang Taeyang', '+821030000006', '@kangty', '2025-09-01'),
 (7, 'Yoon Seoa', 2, '+821020000007', 'Yoon Hyejin', '+821030000007', '@yoonhj', '2026-03-03'),
 (8, 'Jang Yejun', 2, NULL, 'Jang Minseok', '+821030000008', NULL, '2026-03-03'),
 (9, 'Lim Jiwoo', 3, '+821020000009', 'Lim Sunhee', '+821030000009', '@limsunhee', '2024-03-04'),
 (10, 'Han Yuna', 3, '+821020000010', 'Han Jaewon', '+821030000010', NULL, '2024-03-04'),
 (11, 'Oh Junseo', 3, NULL, 'Oh Mijin', '+821030000011', '@ohmijin', '2025-03-02'),
 (12, 'Seo Eunwoo', 3, '+821020000012', 'Seo Kyungmin', '+821030000012', '@seokm', '2025-09-01');
INSERT INTO announcements (title, content, published_at, published_by) VALUES
 ('Winter break', 'Classes pause from December 24 to January 2 and resume on January 5.',
  datetime('now', '-7 days'), 1),
 ('Parent meeting', 'Parents of 6A are invited to meet Ms Kang on Friday at 19:30.',
  datetime('now', '-2 days'), 3);
";

const NORTH_SAMPLE: &str = "
INSERT INTO classes (id, name, teacher, schedule, monthly_fee) VALUES
 (1, 'Algebra I', 'Laura Gómez', 'Tue, Thu 17:00-18:30', 120),
 (2, 'Chemistry', 'Pablo Ortega', 'Sat 10:00-12:00', 90);
INSERT INTO students (id, name, class_id, phone, parent_name, parent_phone, parent_telegram, enrolled_on) VALUES
 (1, 'Lucía Martín', 1, '+34600000101', 'Elena Martín', '+34600000201', '@elenamartin', '2025-09-15'),
 (2, 'Hugo Sanz', 1, NULL, 'Javier Sanz', '+34600000202', NULL, '2025-09-15'),
 (3, 'Sara Vidal', 2, '+34600000103', 'Marta Vidal', '+34600000203', '@martavidal', '2026-01-12'),
 (4, 'Mateo Ruiz', 2, NULL, 'Ana Ruiz', '+34600000204', NULL, '2026-01-12');
";

/// A backend failure that is not the caller's fault.
#[derive(Debug, thiserror::Error)]
pub enum AcademyError {
    /// A tenant database could not be opened, created or filled.
    #[error("the database of tenant {tenant} ({path}): {source}")]
    Database {
        /// The tenant's slug.
        tenant: &'static str,
        /// The file.
        path: String,
        /// Why.
        source: sqlx::Error,
    },
    /// The read-only query tool could not be built over a tenant's file.
    #[error(transparent)]
    QueryTool(#[from] toolgraph_agents::academy::sql::SqlError),
}

/// A tenant's data: a read-write pool for the approved actions, and `general_query` over the
/// same file, read-only, in a registry of its own (which checks its arguments, bounds its time
/// and catches its failures).
pub struct TenantData {
    /// Which tenant.
    pub tenant: Tenant,
    /// Read-write; only the write tools use it.
    pub pool: SqlitePool,
    /// The read-only SQL tool the model's queries run through, alone in its registry.
    pub general_query: ToolRegistry,
}

/// Every tenant's data, opened (and on first start created) under a directory.
pub struct Academy {
    tenants: HashMap<i64, TenantData>,
}

impl Academy {
    /// Opens `dir/tenant-{id}.db` for each tenant, creating and filling it on first start.
    ///
    /// # Errors
    /// When a file cannot be opened, created or filled.
    pub async fn open(dir: &Path) -> Result<Self, AcademyError> {
        let mut tenants = HashMap::new();
        for tenant in TENANTS {
            let path = dir.join(format!("tenant-{}.db", tenant.id));
            let err = |source| AcademyError::Database { tenant: tenant.slug, path: path.display().to_string(), source };
            let options = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5));
            let pool = SqlitePoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(5))
                .connect_with(options)
                .await
                .map_err(err)?;
            fill(&pool, tenant).await.map_err(err)?;
            let mut general_query = ToolRegistry::new();
            let tool = toolgraph_agents::academy::sql::general_query(&path.display().to_string()).await?;
            // A new registry holds no other tool: the name cannot clash.
            general_query.register(tool).expect("one tool in an empty registry"); // invariant
            tenants.insert(tenant.id, TenantData { tenant: *tenant, pool, general_query });
        }
        Ok(Self { tenants })
    }

    /// The tenant `id`'s data, when it is one of ours and `slug` is its slug.
    pub fn tenant(&self, id: i64, slug: &str) -> Option<&TenantData> {
        self.tenants.get(&id).filter(|t| t.tenant.slug == slug)
    }

    /// Whether `user` is staff of `tenant`.
    pub fn is_staff(tenant: i64, user: i64) -> bool {
        STAFF.iter().any(|&(u, t, _)| u == user && t == tenant)
    }

    /// Closes every pool (their files are checkpointed and released).
    pub async fn close(&self) {
        for t in self.tenants.values() {
            t.pool.close().await;
        }
    }
}

/// Creates the tables and, when the file is new, the sample academy.
async fn fill(pool: &SqlitePool, tenant: &Tenant) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::raw_sql(TABLES).execute(&mut *tx).await?;
    let classes: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM classes").fetch_one(&mut *tx).await?;
    if classes == 0 {
        let sample = if tenant.slug == "demo" { DEMO_SAMPLE } else { NORTH_SAMPLE };
        sqlx::raw_sql(sample).execute(&mut *tx).await?;
        sqlx::raw_sql(ACTIVITY).execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// A tool result or the first result of the same action, as stored.
pub(crate) fn stored_result(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Row;

    #[tokio::test]
    async fn the_schema_description_names_every_table_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let academy = Academy::open(dir.path()).await.unwrap();
        let pool = &academy.tenant(1, "demo").unwrap().pool;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name <> 'chatbot_actions' ORDER BY name",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        assert_eq!(tables.len(), 7, "{tables:?}");
        for table in tables {
            let line = SCHEMA_DESCRIPTION
                .lines()
                .find(|l| l.starts_with(&format!("- {table}(")))
                .unwrap_or_else(|| panic!("{table} is not described"));
            let columns = sqlx::query(&format!("PRAGMA table_info({table})")).fetch_all(pool).await.unwrap();
            for c in columns {
                let name: String = c.get("name");
                assert!(line.contains(&name), "{table}.{name} is not described: {line}");
            }
        }
    }

    #[tokio::test]
    async fn each_tenant_has_its_own_sample_and_a_second_start_keeps_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let academy = Academy::open(dir.path()).await.unwrap();
        let count = |slug: &'static str, id| {
            let pool = academy.tenant(id, slug).unwrap().pool.clone();
            async move { sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM students").fetch_one(&pool).await.unwrap() }
        };
        assert_eq!((count("demo", 1).await, count("north", 2).await), (12, 4));
        let unpaid: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM payments WHERE paid_on IS NULL AND month = strftime('%Y-%m', 'now')",
        )
        .fetch_one(&academy.tenant(1, "demo").unwrap().pool)
        .await
        .unwrap();
        assert_eq!(unpaid, 3, "students 3, 7 and 11 have not paid this month");
        sqlx::query("UPDATE classes SET teacher = 'Baek Sora' WHERE name = '5A'")
            .execute(&academy.tenant(1, "demo").unwrap().pool)
            .await
            .unwrap();
        academy.close().await;
        let again = Academy::open(dir.path()).await.unwrap();
        let pool = &again.tenant(1, "demo").unwrap().pool;
        let teacher: String =
            sqlx::query_scalar("SELECT teacher FROM classes WHERE name = '5A'").fetch_one(pool).await.unwrap();
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM students").fetch_one(pool).await.unwrap();
        assert_eq!((teacher.as_str(), n), ("Baek Sora", 12), "a second start neither refills nor resets");
        assert!(again.tenant(1, "north").is_none() && again.tenant(9, "demo").is_none());
    }
}
