//! [`KbWriter`]: one ingest's changes to a knowledge base, made visible by a single tantivy
//! commit, so a crash part-way leaves the previous index as it was. Only one writer may exist
//! per knowledge base, across processes (tantivy's lock), which is how concurrent ingests are
//! refused. A knowledge base on Qdrant gathers the ingest's changes and sends them at commit
//! (there, concurrent ingests of one knowledge base are not refused: the last one wins).

use crate::RagError;
use crate::index::qdrant::SourceUpdate;
use crate::index::schema::{encode_vector, filterable};
use crate::index::{Chunk, KnowledgeBase};
use tantivy::{IndexWriter, TantivyDocument, Term};

impl KnowledgeBase {
    /// A writer for one ingest. Only one may exist per knowledge base across processes.
    ///
    /// # Errors
    /// [`RagError::Busy`] when another ingest holds the knowledge base.
    pub fn writer(&self) -> Result<KbWriter<'_>, RagError> {
        if self.remote.is_some() {
            return Ok(KbWriter { kb: self, writer: None, updates: Vec::new(), removed: Vec::new() });
        }
        let writer = self.index.writer_with_num_threads(2, 96_000_000).map_err(|e| match e {
            tantivy::TantivyError::LockFailure(..) => RagError::Busy(self.manifest.name.clone()),
            other => RagError::Index(other),
        })?;
        Ok(KbWriter { kb: self, writer: Some(writer), updates: Vec::new(), removed: Vec::new() })
    }
}

/// One ingest's changes; nothing is visible until [`KbWriter::commit`].
pub struct KbWriter<'a> {
    kb: &'a KnowledgeBase,
    /// The tantivy writer; `None` for a knowledge base on Qdrant.
    writer: Option<IndexWriter>,
    /// What goes to Qdrant at commit.
    updates: Vec<SourceUpdate>,
    removed: Vec<String>,
}

impl KbWriter<'_> {
    /// Replaces every chunk of `source` with `chunks`, recording `hash`.
    ///
    /// # Errors
    /// When tantivy fails.
    pub fn replace_source(&mut self, source: &str, hash: &str, chunks: &[Chunk]) -> Result<(), RagError> {
        self.replace_source_embedded(source, hash, chunks, None)
    }

    /// Like [`KbWriter::replace_source`], storing each chunk's vector with it.
    ///
    /// # Errors
    /// [`RagError::Mismatch`] when the vectors do not match the chunks or the knowledge base's
    /// embedding settings; tantivy failures.
    pub fn replace_source_embedded(
        &mut self,
        source: &str,
        hash: &str,
        chunks: &[Chunk],
        vectors: Option<&[Vec<f32>]>,
    ) -> Result<(), RagError> {
        let f = self.kb.fields;
        let dim = self.kb.manifest.embedding.as_ref().map(|e| e.dimension);
        match (vectors, dim) {
            (Some(v), Some(d)) if v.len() == chunks.len() && v.iter().all(|x| x.len() == d) => {}
            (None, None) => {}
            (None, Some(_)) if chunks.is_empty() => {}
            _ => {
                return Err(RagError::Mismatch(format!(
                    "{source}: knowledge base `{}` {} but the chunks come {}",
                    self.kb.manifest.name,
                    dim.map_or("stores no vectors".to_owned(), |d| format!("stores {d}-dimension vectors")),
                    vectors.map_or("without vectors".to_owned(), |v| format!(
                        "with {} vectors of {} dimensions",
                        v.len(),
                        v.first().map_or(0, Vec::len)
                    ))
                )));
            }
        }
        let Some(writer) = self.writer.as_mut() else {
            self.updates.push(SourceUpdate {
                source: source.to_owned(),
                hash: hash.to_owned(),
                chunks: chunks.to_vec(),
                vectors: vectors.map(<[Vec<f32>]>::to_vec),
            });
            return Ok(());
        };
        writer.delete_term(Term::from_field_text(f.source, source));
        for (i, c) in chunks.iter().enumerate() {
            let mut doc = TantivyDocument::default();
            doc.add_text(f.chunk_id, &c.id);
            doc.add_text(f.doc_id, &c.doc_id);
            doc.add_text(f.source, source);
            doc.add_text(f.source_hash, hash);
            let title =
                if c.headings.is_empty() { c.title.clone() } else { format!("{} {}", c.title, c.headings.join(" ")) };
            doc.add_text(f.title, &title);
            doc.add_text(f.doc_title, &c.title);
            doc.add_text(f.text, &c.text);
            doc.add_text(f.headings, serde_json::to_string(&c.headings).unwrap_or_else(|_| "[]".into()));
            doc.add_text(f.citation, &c.citation);
            doc.add_text(f.part, format!("{}/{}", c.part.0, c.part.1));
            doc.add_text(f.meta_json, serde_json::to_string(&c.meta).unwrap_or_else(|_| "{}".into()));
            doc.add_object(f.meta, filterable(&c.meta));
            if let Some(v) = vectors.and_then(|v| v.get(i)) {
                doc.add_bytes(f.vector, &encode_vector(v));
            }
            writer.add_document(doc)?;
        }
        Ok(())
    }

    /// Removes every chunk of `source`.
    pub fn remove_source(&mut self, source: &str) {
        match self.writer.as_mut() {
            Some(writer) => {
                writer.delete_term(Term::from_field_text(self.kb.fields.source, source));
            }
            None => self.removed.push(source.to_owned()),
        }
    }

    /// Makes the ingest durable and visible, atomically.
    ///
    /// # Errors
    /// When tantivy fails (the previous index stays as it was).
    pub fn commit(self) -> Result<(), RagError> {
        let Some(mut writer) = self.writer else {
            let Some(remote) = &self.kb.remote else { return Ok(()) };
            let mut analyzer = self.kb.analyzer.clone();
            return remote.apply(&self.updates, &self.removed, &mut analyzer, &self.kb.manifest);
        };
        writer.commit()?;
        // One segment searches fastest; knowledge bases are small enough to merge whole.
        let segments = self.kb.index.searchable_segment_ids()?;
        if segments.len() > 1 {
            writer.merge(&segments).wait()?;
        }
        writer.wait_merging_threads()?;
        self.kb.reader.reload()?;
        Ok(())
    }
}
