//! `toolgraph config`: the effective configuration, secrets masked.

use clap::Subcommand;
use std::process::ExitCode;
use toolgraph_config::Config;

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration (defaults < file < environment), secrets masked.
    Show {
        /// Print JSON instead of TOML.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: ConfigCommand, cfg: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        ConfigCommand::Show { json } => {
            if json {
                println!("{}", serde_json::to_string_pretty(cfg)?);
            } else {
                print!("{}", cfg.to_masked_toml());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
