//! `academy-backend`: the academy admin example's backend as a process (see `lib.rs`).
//!
//! ```text
//! LUMIE_INTERNAL_HMAC_SECRET=… academy-backend --data-dir DIR [--listen 127.0.0.1:8080]
//!     [--accept-v1-signatures]
//! ```
//! It prints `listening on http://ADDR` once it accepts calls (`--listen 127.0.0.1:0` picks a
//! free port), and stops on Ctrl-C or SIGTERM.

use anyhow::{Context, bail};
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use toolgraph_conversations::SqliteConversationStore;
use toolgraph_graph::sqlite::SqliteDatabase;
use toolgraph_server::auth::HmacVerifier;

#[derive(Parser)]
#[command(about = "The reference backend of toolgraph's academy admin example")]
struct Args {
    /// Where the academy's and the conversations' SQLite files live (created on first start).
    #[arg(long, default_value = ".academy-backend")]
    data_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// The secret shared with `toolgraph serve` (its `server.backend_hmac_secret`), which the
    /// service signs its calls here with.
    #[arg(long, env = "LUMIE_INTERNAL_HMAC_SECRET", hide_env_values = true)]
    hmac_secret: String,
    /// Also accept v1 signatures (timestamp and body only), for the window in which a service
    /// not yet upgraded still sends them; off again once it signs v2 (docs/service.md,
    /// "Switching to v2").
    #[arg(long, env = "LUMIE_ACCEPT_V1_SIGNATURES")]
    accept_v1_signatures: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.hmac_secret.len() < 16 {
        bail!("the HMAC secret must be at least 16 bytes (LUMIE_INTERNAL_HMAC_SECRET)");
    }
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("creating {}", args.data_dir.display()))?;
    let academy = Arc::new(academy_backend::academy::Academy::open(&args.data_dir).await?);
    let chat_db = args.data_dir.join("conversations.db");
    let db = SqliteDatabase::open(&chat_db).await.with_context(|| format!("opening {}", chat_db.display()))?;
    let conversations = Arc::new(SqliteConversationStore::new(db).await.context("migrating the conversation store")?);
    if args.accept_v1_signatures {
        tracing::warn!(
            "accepting v1 signatures, which do not cover the method or path: turn this off once the service signs v2"
        );
    }
    // One process: the nonces it accepted are kept in memory (a backend run as replicas gives
    // its verifier a shared `PostgresReplayStore`).
    let verifier = Arc::new(HmacVerifier::new(args.hmac_secret.into_bytes()).accepting_v1(args.accept_v1_signatures));
    let app = academy_backend::router(Arc::clone(&academy), conversations, verifier);
    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).with_graceful_shutdown(shutdown()).await.context("serving")?;
    academy.close().await;
    Ok(())
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
            let _ = ctrl_c.await;
            return;
        };
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
