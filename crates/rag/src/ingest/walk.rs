//! The files an ingest reads: each path given, folders walked in name order.
//!
//! Symbolic links are followed, so a linked folder of documents is ingested like any other; a
//! link back to a folder the walk is inside (a loop) would never end, so it is reported as a
//! [`SkippedFile`] and the walk goes on. Hidden entries (a name starting with `.`, or not
//! UTF-8) are left out. Extensions are not checked here: the parser reports an unsupported
//! file with its reason.

use super::SkippedFile;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use walkdir::WalkDir;

/// A file to read.
pub(super) struct FileItem {
    pub(super) path: PathBuf,
    /// Relative to the ingested root's parent, `/`-separated (the document id).
    pub(super) id: String,
    /// Relative to the ingested root (what path patterns see).
    pub(super) rel: String,
}

/// Appends the files under `roots` to `out` (sorted by path) and what cannot be walked to
/// `skipped`.
pub(super) fn collect_files(roots: &[PathBuf], out: &mut Vec<FileItem>, skipped: &mut Vec<SkippedFile>) {
    for root in roots {
        let meta = match std::fs::metadata(root) {
            Ok(m) => m,
            Err(e) => {
                skipped.push(SkippedFile { path: root.display().to_string(), reason: e.to_string() });
                continue;
            }
        };
        let root_name = root.file_name().and_then(|n| n.to_str()).unwrap_or("").to_owned();
        if meta.is_file() {
            out.push(FileItem { path: root.clone(), id: root_name.clone(), rel: root_name });
            continue;
        }
        if !meta.is_dir() {
            // Neither a file nor a folder (a socket, a device): what listing it as a folder says.
            let reason =
                std::fs::read_dir(root).err().map_or_else(|| "not a file or a folder".into(), |e| e.to_string());
            skipped.push(SkippedFile { path: root.display().to_string(), reason });
            continue;
        }
        let entries = WalkDir::new(root)
            .follow_links(true)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| e.depth() == 0 || !hidden(e.file_name()));
        for entry in entries {
            match entry {
                Ok(e) if e.file_type().is_dir() => {}
                Ok(e) => out.push(file_item(root, &root_name, e.into_path())),
                Err(err) => {
                    let Some(path) = err.path().map(Path::to_path_buf) else { continue };
                    // The filter above never sees entries that fail; hidden ones stay unread.
                    if err.depth() > 0 && path.file_name().is_some_and(hidden) {
                        continue;
                    }
                    if let Some(ancestor) = err.loop_ancestor() {
                        let reason =
                            format!("symbolic link loop: it leads back to {}, already being read", ancestor.display());
                        skipped.push(SkippedFile { path: path.display().to_string(), reason });
                    } else if err.depth() > 0 && std::fs::metadata(&path).is_err() {
                        // A link to nothing is a file that cannot be read: the parser says why.
                        out.push(file_item(root, &root_name, path));
                    } else {
                        let reason = err.io_error().map_or_else(|| err.to_string(), ToString::to_string);
                        skipped.push(SkippedFile { path: path.display().to_string(), reason });
                    }
                }
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
}

fn hidden(name: &OsStr) -> bool {
    name.to_str().is_none_or(|n| n.starts_with('.'))
}

fn file_item(root: &Path, root_name: &str, path: PathBuf) -> FileItem {
    let rel = path
        .strip_prefix(root)
        .unwrap_or(&path)
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .collect::<Vec<_>>()
        .join("/");
    let id = if root_name.is_empty() { rel.clone() } else { format!("{root_name}/{rel}") };
    FileItem { path, id, rel }
}
