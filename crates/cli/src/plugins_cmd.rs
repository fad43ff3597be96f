//! `toolgraph plugins list|check [DIR...]`: what the plugin directories hold, what loads, and
//! why the rest does not.

use std::path::PathBuf;
use std::process::ExitCode;
use toolgraph_config::Config;
use toolgraph_plugins::Loaded;

#[derive(Debug, clap::Subcommand)]
pub enum PluginsCommand {
    /// The plugins that load (name, version, kind, class, directory), then any that do not.
    List {
        /// Directories to search (default: `plugins.dirs`).
        dirs: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Loads every plugin and reports each problem (file, line, field); exits 1 if any.
    Check {
        /// Directories to search (default: `plugins.dirs`).
        dirs: Vec<PathBuf>,
    },
}

async fn load(dirs: Vec<PathBuf>, cfg: &Config) -> anyhow::Result<(Vec<PathBuf>, Loaded)> {
    let dirs = if dirs.is_empty() { cfg.plugins.dirs.clone() } else { dirs };
    if dirs.is_empty() {
        anyhow::bail!("no plugin directory: give one, or set [plugins] dirs in toolgraph.toml");
    }
    let loaded = toolgraph_plugins::load_all(&dirs, &cfg.plugins.locale).await;
    Ok((dirs, loaded))
}

pub async fn run(cmd: PluginsCommand, cfg: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        PluginsCommand::List { dirs, json } => {
            let (_, loaded) = load(dirs, cfg).await?;
            if json {
                let rows: Vec<serde_json::Value> = loaded
                    .plugins
                    .iter()
                    .map(|p| {
                        serde_json::json!({
                            "name": p.name,
                            "version": p.version.to_string(),
                            "kind": format!("{:?}", p.kind).to_lowercase(),
                            "dir": p.dir,
                            "tools": p.tools.iter().map(|t| t.spec()).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                let errors: Vec<String> = loaded.errors.iter().map(ToString::to_string).collect();
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({"plugins": rows, "errors": errors}))?);
            } else {
                for p in &loaded.plugins {
                    let kind = format!("{:?}", p.kind).to_lowercase();
                    for t in &p.tools {
                        let class = format!("{:?}", t.spec().class).to_lowercase();
                        println!(
                            "{:<32} {:<10} {:<5} {:<6} {}",
                            t.spec().name,
                            p.version,
                            kind,
                            class,
                            p.dir.display()
                        );
                    }
                }
                for s in &loaded.superseded {
                    println!("{:<24} {:<10} (superseded by {}) {}", s.name, s.version, s.by, s.dir.display());
                }
                for e in &loaded.errors {
                    eprintln!("not loaded: {e}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginsCommand::Check { dirs } => {
            let (dirs, loaded) = load(dirs, cfg).await?;
            for e in &loaded.errors {
                eprintln!("error: {e}");
            }
            let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            println!(
                "{} plugin(s) load, {} error(s) in {}",
                loaded.plugins.len(),
                loaded.errors.len(),
                searched.join(", ")
            );
            Ok(if loaded.errors.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}
