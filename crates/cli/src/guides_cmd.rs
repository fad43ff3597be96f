//! `toolgraph guides import|show|list`: the teaching guides `get_guia` reads (docs/course.md).

use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use toolgraph_agents::course::guides::{Guide, GuideError, MAX_GUIDE_BYTES, Upserted, navigate};
use toolgraph_config::Config;

#[derive(Debug, clap::Subcommand)]
pub enum GuidesCommand {
    /// Store guides from JSON files (one guide per file), replacing each subject's earlier one;
    /// every file is checked first, and nothing is stored if one is wrong.
    Import {
        /// The files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The tenant whose guides they are. Default: `rag.tenant`.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Print a subject's guide: its summary, or one section (`--key competencias.generales`).
    Show {
        /// The subject identifier (`iv`).
        subject: String,
        /// A section or a dot path into one.
        #[arg(long)]
        key: Option<String>,
        /// Default: `rag.tenant`.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// The subjects with a guide.
    List {
        /// Default: `rag.tenant`.
        #[arg(long)]
        tenant: Option<String>,
    },
}

/// Reads and checks one guide file.
async fn read_guide(path: &PathBuf) -> anyhow::Result<Guide> {
    let bytes = tokio::fs::read(path).await.with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() > MAX_GUIDE_BYTES {
        anyhow::bail!("{}: the guide is larger than {MAX_GUIDE_BYTES} bytes", path.display());
    }
    let doc: serde_json::Value =
        serde_json::from_slice(&bytes).with_context(|| format!("{}: not JSON", path.display()))?;
    Guide::from_json(doc).map_err(|e| match e {
        GuideError::Invalid { field, message } => anyhow::anyhow!("{}: field `{field}` {message}", path.display()),
        other => anyhow::anyhow!("{}: {other}", path.display()),
    })
}

pub async fn run(cmd: GuidesCommand, cfg: &Config) -> anyhow::Result<ExitCode> {
    let store = toolgraph_agents::assembly::guide_store(cfg).await?;
    let tenant_of = |t: Option<String>| t.unwrap_or_else(|| cfg.rag.tenant.clone());
    match cmd {
        GuidesCommand::Import { files, tenant } => {
            let tenant = tenant_of(tenant);
            let mut guides = Vec::with_capacity(files.len());
            for path in &files {
                guides.push((path, read_guide(path).await?));
            }
            for (path, guide) in guides {
                let done = store.upsert(&tenant, &guide).await?;
                let what = match done {
                    Upserted::Inserted => "added",
                    Upserted::Updated => "updated",
                    Upserted::Unchanged => "unchanged",
                };
                println!("{what}: {} ({}) from {}", guide.subject, tenant, path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        GuidesCommand::Show { subject, key, tenant } => {
            let tenant = tenant_of(tenant);
            let Some(doc) = store.get(&tenant, &subject).await? else {
                anyhow::bail!(
                    "no guide for subject '{subject}' (tenant {tenant}); import one with `toolgraph guides import`"
                );
            };
            let shown = match key.as_deref() {
                Some(k) => navigate(&doc, k).cloned().with_context(|| format!("the guide has no '{k}'"))?,
                None => Guide::summary(&doc),
            };
            println!("{}", serde_json::to_string_pretty(&shown)?);
            Ok(ExitCode::SUCCESS)
        }
        GuidesCommand::List { tenant } => {
            for subject in store.subjects(&tenant_of(tenant)).await? {
                println!("{subject}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
