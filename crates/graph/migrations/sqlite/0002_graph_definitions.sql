-- What each version of a graph was built from, so a thread paused on a version this process
-- never loaded (it paused before a restart, or on another replica) resumes on its own.
CREATE TABLE IF NOT EXISTS graph_definitions (
    version       TEXT    NOT NULL PRIMARY KEY,
    definition    TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
