//! `exec` plugins: a program run directly (never through a shell) in its plugin's directory,
//! the arguments as one JSON object on stdin, the result as one JSON value on stdout.
//!
//! The program gets a cleared environment (only the manifest's `env` allow-list passes), runs
//! in a process group of its own, and is killed with that whole group past its time limit, or
//! when the call is abandoned (the run was cancelled) — so a plugin that forks cannot leave a
//! process behind. A non-zero exit, output that is not JSON, or more than 1 MiB of output is a
//! failure outcome the model reads, never a failure of the run.

use crate::manifest::{ExecSpec, ManifestError};
use crate::tool::{Common, Runner};
use async_trait::async_trait;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolgraph_tools::{ToolContext, ToolError};

/// Most output read from a plugin, per stream.
const MAX_OUTPUT: usize = 1024 * 1024;

/// Most of a failing plugin's stderr quoted in its error.
const QUOTED_STDERR: usize = 500;

/// Runs a plugin's program.
pub struct ExecRunner {
    command: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    /// Variable names the program may see; their values are read at each call.
    env: Vec<String>,
}

impl ExecRunner {
    /// The runner of `spec`, its program resolved against `dir`.
    ///
    /// # Errors
    /// When the program does not exist or is not an executable file.
    pub fn new(dir: &Path, spec: &ExecSpec, env: &[String]) -> Result<Self, ManifestError> {
        let fail = |message: String| ManifestError {
            path: dir.join(crate::manifest::MANIFEST),
            line: None,
            field: Some("exec.command".into()),
            message,
        };
        let dir = std::fs::canonicalize(dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        // Absolute, so the program is found whatever directory it runs in (its plugin's), but not
        // canonicalized: a launcher that is a symlink (a virtualenv's `python`) finds its
        // environment by the path it was started as.
        let command = if spec.command.is_absolute() { spec.command.clone() } else { dir.join(&spec.command) };
        let meta = std::fs::metadata(&command).map_err(|e| fail(format!("{}: {e}", command.display())))?;
        if !meta.is_file() {
            return Err(fail(format!("{} is not a file", command.display())));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o111 == 0 {
                return Err(fail(format!("{} is not executable (chmod +x)", command.display())));
            }
        }
        Ok(Self { command, args: spec.args.clone(), dir, env: env.to_vec() })
    }

    /// Runs the program once with `input` on stdin; returns its stdout.
    async fn output(&self, common: &Common, input: Vec<u8>) -> Result<Vec<u8>, ToolError> {
        let name = common.name();
        let mut cmd = plugin_command(&self.command, &self.args, &self.dir, &self.env);
        cmd.stderr(Stdio::piped());
        isolate(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| {
            ToolError::unavailable(format!("plugin '{name}' cannot start {}: {e}", self.command.display()))
        })?;
        // Whatever happens from here on (time limit, cancellation), the group goes with this guard.
        let _group = ProcessGroup::of(&child);
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ToolError::internal(format!("plugin '{name}': its pipes are missing")));
        };
        let work = async {
            // A program that does not read its input must not block the call: the write ends
            // when the program exits (the pipe breaks), which is then not an error.
            let feed = async move {
                let _ = stdin.write_all(&input).await;
                drop(stdin);
            };
            let (_, out, err, status) = tokio::join!(feed, read_bounded(stdout), read_bounded(stderr), child.wait());
            (out, err, status)
        };
        let (out, err, status) = tokio::time::timeout(common.limit(), work).await.map_err(|_| {
            ToolError::timeout(format!(
                "plugin '{name}' did not finish within {} ms and was stopped",
                common.timeout_ms
            ))
        })?;
        let status = status.map_err(|e| ToolError::internal(format!("plugin '{name}': {e}")))?;
        let (out, err) = (out?, err.unwrap_or_default());
        if !status.success() {
            let stderr: String = String::from_utf8_lossy(&err).trim().chars().take(QUOTED_STDERR).collect();
            let how = status.code().map_or_else(|| "was killed by a signal".to_owned(), |c| format!("exited with {c}"));
            return Err(ToolError::internal(format!("plugin '{name}' {how}: {stderr}")));
        }
        Ok(out)
    }
}

/// Reads a whole stream, at most [`MAX_OUTPUT`] bytes.
async fn read_bounded(stream: impl tokio::io::AsyncRead + Unpin) -> Result<Vec<u8>, ToolError> {
    let mut buf = Vec::new();
    stream.take(MAX_OUTPUT as u64 + 1).read_to_end(&mut buf).await.map_err(|e| ToolError::internal(e.to_string()))?;
    if buf.len() > MAX_OUTPUT {
        return Err(ToolError::internal(format!("the plugin wrote more than {MAX_OUTPUT} bytes")));
    }
    Ok(buf)
}

/// A plugin's program as it runs: no shell, in `dir`, an environment cleared but for the
/// variables named in `env`, stdin and stdout piped, killed if its handle is dropped.
pub(crate) fn plugin_command(program: &Path, args: &[String], dir: &Path, env: &[String]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .envs(env.iter().filter_map(|k| std::env::var_os(k).map(|v| (k, v))))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Starts `cmd` in a process group of its own (so its whole group can be killed).
pub(crate) fn isolate(cmd: &mut tokio::process::Command) {
    #[cfg(unix)]
    cmd.process_group(0);
}

/// [`isolate`], and on Linux the child also gets SIGKILL when the thread that started it ends:
/// toolgraph starts long-lived servers from its runtime's worker threads, which live as long as
/// the process, so a server dies with toolgraph even when toolgraph itself is killed.
pub(crate) fn isolate_for_life(cmd: &mut tokio::process::Command) {
    isolate(cmd);
    #[cfg(target_os = "linux")]
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl(2),
    // which is async-signal-safe, with constant arguments.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Kills a plugin's whole process group when dropped (a group whose leader already exited and
/// was reaped is gone, or holds only its orphans, which go too).
pub(crate) struct ProcessGroup(Option<u32>);

impl ProcessGroup {
    /// The group `child` leads (it was started through [`isolate`]).
    pub(crate) fn of(child: &tokio::process::Child) -> Self {
        Self(child.id())
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 0) {
            // SAFETY: kill(2) takes plain integers and touches no memory of ours; a negative pid
            // addresses the process group the child leads (it was started with process_group(0)).
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
    }
}

#[async_trait]
impl Runner for ExecRunner {
    async fn run(&self, common: &Common, _ctx: &ToolContext, arguments: Value) -> Result<Value, ToolError> {
        let input = serde_json::to_vec(&arguments).map_err(|e| ToolError::internal(e.to_string()))?;
        let out = self.output(common, input).await?;
        serde_json::from_slice(&out).map_err(|e| {
            let shown: String = String::from_utf8_lossy(&out).trim().chars().take(QUOTED_STDERR).collect();
            ToolError::internal(format!("plugin '{}' did not print JSON ({e}): {shown}", common.name()))
        })
    }
}
