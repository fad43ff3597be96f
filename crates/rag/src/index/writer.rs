//! [`KbWriter`]: one ingest's changes to a knowledge base, made visible by a single tantivy
//! commit, so a crash part-way leaves the previous index as it was. Only one writer may exist
//! per knowledge base, across processes (tantivy's lock), which is how concurrent ingests are
//! refused.

use crate::RagError;
use crate::index::schema::{encode_vector, filterable};
use crate::index::{Chunk, KnowledgeBase};
use tantivy::{IndexWriter, TantivyDocument, Term};

impl KnowledgeBase {
    /// A writer for one ingest. Only one may exist per knowledge base across processes.
    ///
    /// # Errors
    /// [`RagError::Busy`] when another ingest holds the knowledge base.
    pub fn writer(&self) -> Result<KbWriter<'_>, RagError> {
        let writer = self.index.writer_with_num_threads(2, 96_000_000).map_err(|e| match e {
            tantivy::TantivyError::LockFailure(..) => RagError::Busy(self.manifest.name.clone()),
            other => RagError::Index(other),
        })?;
        Ok(KbWriter { kb: self, writer })
    }
}

/// One ingest's changes; nothing is visible until [`KbWriter::commit`].
pub struct KbWriter<'a> {
    kb: &'a KnowledgeBase,
    writer: IndexWriter,
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
        self.writer.delete_term(Term::from_field_text(f.source, source));
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
            self.writer.add_document(doc)?;
        }
        Ok(())
    }

    /// Removes every chunk of `source`.
    pub fn remove_source(&mut self, source: &str) {
        self.writer.delete_term(Term::from_field_text(self.kb.fields.source, source));
    }

    /// Makes the ingest durable and visible, atomically.
    ///
    /// # Errors
    /// When tantivy fails (the previous index stays as it was).
    pub fn commit(mut self) -> Result<(), RagError> {
        self.writer.commit()?;
        // One segment searches fastest; knowledge bases are small enough to merge whole.
        let segments = self.kb.index.searchable_segment_ids()?;
        if segments.len() > 1 {
            self.writer.merge(&segments).wait()?;
        }
        self.writer.wait_merging_threads()?;
        self.kb.reader.reload()?;
        Ok(())
    }
}
