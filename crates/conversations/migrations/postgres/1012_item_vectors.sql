-- What a memory item means to an embedding model (docs/memory.md, "Search by meaning"): its
-- vector as little-endian f32s, and the model that made it (a vector of another model is
-- not compared); and which of its fields are embedded (NULL: its text; `[]`: none; else a
-- JSON list of field names).
ALTER TABLE memory_items ADD COLUMN IF NOT EXISTS vector BYTEA;
ALTER TABLE memory_items ADD COLUMN IF NOT EXISTS vector_model TEXT;
ALTER TABLE memory_items ADD COLUMN IF NOT EXISTS index_fields TEXT;
