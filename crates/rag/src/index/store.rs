//! [`KbStore`]: finds, creates and caches the knowledge bases under one root directory,
//! `<root>/<tenant>/<kb>/`. Tenants are directories, so one tenant's search can never see
//! another's chunks; an open knowledge base is shared, so its reader and dense index are built once.
//! With Qdrant configured, knowledge bases are collections there instead (every replica sees
//! the same), found by name.

use super::io_err;
use super::manifest::{read_manifest, write_manifest};
use crate::RagError;
use crate::index::qdrant::QdrantIndex;
use crate::index::{DenseOptions, KbManifest, KnowledgeBase, QdrantOptions, validate_name};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How long an open knowledge base on Qdrant is reused before its collection is read again:
/// another process may have re-created it with another manifest, or deleted it.
const REMOTE_FRESH: std::time::Duration = std::time::Duration::from_secs(10);

/// Finds and opens knowledge bases under a root directory (`<data_dir>/kb`).
#[derive(Debug)]
pub struct KbStore {
    root: PathBuf,
    open: Mutex<HashMap<(String, String), Arc<KnowledgeBase>>>,
    dense_options: DenseOptions,
    qdrant: Option<QdrantOptions>,
}

impl KbStore {
    /// A store rooted at `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            open: Mutex::new(HashMap::new()),
            dense_options: DenseOptions::default(),
            qdrant: None,
        }
    }

    /// Keeps knowledge bases on the Qdrant server of `options` instead of under the root.
    #[must_use]
    pub fn with_qdrant(mut self, options: QdrantOptions) -> Self {
        self.qdrant = Some(options);
        self
    }

    /// The Qdrant server knowledge bases live on, if any.
    pub fn qdrant(&self) -> Option<&QdrantOptions> {
        self.qdrant.as_ref()
    }

    /// Sets how knowledge bases opened from now on build their dense index.
    #[must_use]
    pub fn with_dense_options(mut self, options: DenseOptions) -> Self {
        self.dense_options = options;
        self
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dir(&self, tenant: &str, name: &str) -> PathBuf {
        self.root.join(tenant).join(name)
    }

    /// Opens an existing knowledge base (cached: later calls share one reader).
    ///
    /// # Errors
    /// [`RagError::UnknownKb`], [`RagError::InvalidName`], or a manifest the build cannot read.
    pub fn open(&self, tenant: &str, name: &str) -> Result<Arc<KnowledgeBase>, RagError> {
        validate_name("tenant", tenant)?;
        validate_name("knowledge base", name)?;
        let key = (tenant.to_owned(), name.to_owned());
        let cached = self.lock().get(&key).cloned();
        if let Some(kb) = cached
            && (!kb.is_remote() || kb.opened.elapsed() < REMOTE_FRESH)
        {
            return Ok(kb);
        }
        if let Some(options) = &self.qdrant {
            let Some((remote, manifest)) = QdrantIndex::open(options, tenant, name)? else {
                return Err(RagError::UnknownKb { tenant: tenant.to_owned(), name: name.to_owned() });
            };
            let kb = Arc::new(KnowledgeBase::in_collection(manifest, remote)?);
            self.lock().insert(key, kb.clone());
            return Ok(kb);
        }
        let dir = self.dir(tenant, name);
        let manifest = read_manifest(&dir, tenant, name)?;
        let mut kb = KnowledgeBase::open_in(manifest, dir)?;
        kb.set_dense_options(self.dense_options);
        let kb = Arc::new(kb);
        self.lock().insert(key, kb.clone());
        Ok(kb)
    }

    /// Opens a knowledge base, creating it with `manifest` when it does not exist. An existing
    /// one keeps its analyzer; asking for a different one is refused.
    ///
    /// # Errors
    /// [`RagError::Mismatch`] when an explicit analyzer differs; I/O and index failures.
    pub fn open_or_create(
        &self,
        manifest: KbManifest,
        explicit_analyzer: bool,
    ) -> Result<Arc<KnowledgeBase>, RagError> {
        match self.open(&manifest.tenant, &manifest.name) {
            Ok(kb) => {
                if explicit_analyzer && kb.manifest.analyzer != manifest.analyzer {
                    return Err(RagError::Mismatch(format!(
                        "knowledge base `{}` was built with the {} analyzer, not {}; ingest into a new knowledge base to change it",
                        manifest.name,
                        kb.manifest.analyzer.code(),
                        manifest.analyzer.code()
                    )));
                }
                Ok(kb)
            }
            Err(RagError::UnknownKb { .. }) if self.qdrant.is_some() => {
                let options = self.qdrant.as_ref().ok_or_else(|| RagError::Qdrant("not configured".into()))?;
                QdrantIndex::create(options, &manifest)?;
                self.open(&manifest.tenant, &manifest.name)
            }
            Err(RagError::UnknownKb { .. }) => {
                let dir = self.dir(&manifest.tenant, &manifest.name);
                std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, &e))?;
                write_manifest(&dir, &manifest)?;
                self.open(&manifest.tenant, &manifest.name)
            }
            Err(e) => Err(e),
        }
    }

    /// Records a new manifest (e.g. a changed record mapping) for an open knowledge base.
    ///
    /// # Errors
    /// I/O failures.
    pub fn update_manifest(&self, manifest: &KbManifest) -> Result<(), RagError> {
        if self.qdrant.is_some() {
            let kb = self.open(&manifest.tenant, &manifest.name)?;
            if let Some(remote) = &kb.remote {
                remote.update_manifest(manifest)?;
            }
            self.lock().remove(&(manifest.tenant.clone(), manifest.name.clone()));
            return Ok(());
        }
        let dir = self.dir(&manifest.tenant, &manifest.name);
        write_manifest(&dir, manifest)?;
        self.lock().remove(&(manifest.tenant.clone(), manifest.name.clone()));
        Ok(())
    }

    /// Drops the cached handle of a knowledge base (its reader, and on disk the thread that
    /// watches it for commits): for the many small ones a caller opens briefly.
    pub fn evict(&self, tenant: &str, name: &str) {
        self.lock().remove(&(tenant.to_owned(), name.to_owned()));
    }

    /// Deletes a tenant's knowledge base with everything in it (its directory, or its Qdrant
    /// collection); whether it existed.
    ///
    /// # Errors
    /// [`RagError::InvalidName`]; [`RagError::Busy`] while an ingest writes it (embedded);
    /// I/O and Qdrant failures.
    pub fn delete(&self, tenant: &str, name: &str) -> Result<bool, RagError> {
        validate_name("tenant", tenant)?;
        validate_name("knowledge base", name)?;
        let kb = match self.open(tenant, name) {
            Ok(kb) => kb,
            Err(RagError::UnknownKb { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        self.lock().remove(&(tenant.to_owned(), name.to_owned()));
        if kb.is_remote() {
            kb.drop_remote()?;
            return Ok(true);
        }
        // Holding the writer's lock while the files go: an ingest running elsewhere is refused
        // rather than left writing into a deleted directory.
        let writer = kb.writer()?;
        let dir = self.dir(tenant, name);
        std::fs::remove_dir_all(&dir).map_err(|e| io_err(&dir, &e))?;
        drop(writer);
        Ok(true)
    }

    /// The knowledge bases of a tenant, by name.
    ///
    /// # Errors
    /// I/O failures other than a missing directory.
    pub fn list(&self, tenant: &str) -> Result<Vec<String>, RagError> {
        validate_name("tenant", tenant)?;
        if let Some(options) = &self.qdrant {
            let mut names = QdrantIndex::list(options, tenant)?;
            names.sort();
            return Ok(names);
        }
        let dir = self.root.join(tenant);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&dir, &e)),
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().join("kb.json").is_file())
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .collect();
        names.sort();
        Ok(names)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<KnowledgeBase>>> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts).
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
