//! Which table versions a reader of this process may see while commits
//! that span several tables land one table at a time, and which commits
//! a transaction, reading every table as of its BEGIN, does not see.
//!
//! Every commit of the process to a table registers too
//! ([`MultiCommits::landing`], through `cirro_storage::write::CommitWatch`)
//! from before it lands until it has ([`MultiCommits::landed`]): a reader
//! that started before it finished reads the table below it, so a
//! transaction that first reads a table after another session committed to
//! it reads the table as it was at its BEGIN.
//!
//! Delta commits are per table, so a transaction that wrote two tables
//! commits them one after the other. [`MultiCommits`] keeps those commits
//! from being seen in part by the process's readers:
//!
//! - a commit over several tables registers, before its first table's
//!   commit, the version each of its tables will get ([`MultiCommits::begin`])
//!   and, once the last is in, finishes ([`MultiCommits::finish`]), which
//!   advances the process's *epoch*;
//! - a reader (a statement, or a transaction from its BEGIN) takes the epoch
//!   when it starts ([`MultiCommits::reader`]); a table it opens is read at the
//!   version before any registered commit that had not finished by then
//!   ([`MultiCommits::visible`]), whether that commit's version of the table
//!   is in or not yet;
//! - every commit of the process to a table waits for a multi-table commit
//!   that holds the table (`cirro_storage::write::commit_gate`), so no
//!   version lands above one that readers skip.
//!
//! Readers in other processes (a `cirro sql --data` beside the server) and
//! other engines read the Delta logs themselves and may see such a commit in
//! part; a cluster refuses transactions over several tables.
//!
//! A crash between two tables' commits must not leave one in and the other
//! out. Before its first table's commit, the committer writes an *intent*,
//! `_cirro_txns/<id>.json` beside the catalog: each table's actions and
//! their inverse. Each commit records the transaction's id in its
//! `commitInfo` (`cirro_storage::write::TRANSACTION_KEY`); the intent goes
//! once the last is in (or all were undone). A process that opens the data
//! location finds an intent left by a crash and finishes it
//! ([`crate::Catalog::recover_transactions`]): it commits the tables whose
//! commit is not in the log, under their write locks (which the committer
//! holds throughout, so a live commit is never taken for a dead one); if
//! one of those commits fails, it undoes the others. Either way the
//! transaction is all in or all out.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// The registry of one process's commits and readers.
#[derive(Debug, Default, Clone)]
pub struct MultiCommits {
    state: Arc<Mutex<Registry>>,
}

#[derive(Debug, Default)]
struct Registry {
    /// Finished multi-table commits so far.
    epoch: u64,
    next_id: u64,
    commits: Vec<Commit>,
    /// Epochs of the readers that run now, with their counts.
    readers: BTreeMap<u64, usize>,
}

#[derive(Debug)]
struct Commit {
    id: u64,
    /// The epoch it finished at (None: landing now).
    finished: Option<u64>,
    /// Table location → the version its commit makes.
    versions: HashMap<String, i64>,
}

/// A registered multi-table commit, finished by [`MultiCommits::finish`]
/// (or on drop, as a commit that is over either way).
#[derive(Debug)]
pub struct CommitTicket {
    id: u64,
    state: Arc<Mutex<Registry>>,
}

/// A reader's place among the commits; it stops counting when dropped.
#[derive(Debug)]
pub struct Reader {
    epoch: u64,
    state: Arc<Mutex<Registry>>,
}

impl Reader {
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut registry = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = registry.readers.get_mut(&self.epoch) {
            *count -= 1;
            if *count == 0 {
                registry.readers.remove(&self.epoch);
            }
        }
        registry.prune();
    }
}

impl Drop for CommitTicket {
    fn drop(&mut self) {
        let mut registry = self.state.lock().unwrap_or_else(|e| e.into_inner());
        registry.finish(self.id);
    }
}

impl Registry {
    fn finish(&mut self, id: u64) {
        let next = self.epoch + 1;
        if let Some(commit) = self
            .commits
            .iter_mut()
            .find(|c| c.id == id && c.finished.is_none())
        {
            commit.finished = Some(next);
            self.epoch = next;
        }
        self.prune();
    }

    /// Forget the finished commits that no running reader started before.
    fn prune(&mut self) {
        let oldest = self.readers.keys().next().copied().unwrap_or(self.epoch);
        self.commits
            .retain(|c| c.finished.is_none_or(|finished| finished > oldest));
    }
}

impl MultiCommits {
    /// Start reading: the commits finished so far are seen whole, the
    /// others not at all, for as long as the reader lives.
    pub fn reader(&self) -> Reader {
        let mut registry = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let epoch = registry.epoch;
        *registry.readers.entry(epoch).or_default() += 1;
        Reader {
            epoch,
            state: Arc::clone(&self.state),
        }
    }

    /// Register a commit that gives each table of `versions` (location →
    /// version) that version, before any of them lands.
    pub fn begin(&self, versions: HashMap<String, i64>) -> CommitTicket {
        let versions = versions
            .into_iter()
            .map(|(location, version)| (location.trim_matches('/').to_string(), version))
            .collect();
        let mut registry = self.state.lock().unwrap_or_else(|e| e.into_inner());
        registry.next_id += 1;
        let id = registry.next_id;
        registry.commits.push(Commit {
            id,
            finished: None,
            versions,
        });
        CommitTicket {
            id,
            state: Arc::clone(&self.state),
        }
    }

    /// The commit is over (every table's version is in, or it was undone):
    /// readers that start from now on see it.
    pub fn finish(&self, ticket: CommitTicket) {
        drop(ticket);
    }

    /// A commit of one table, at `location`, is on its way above version
    /// `after` (its table's commit gate held): until it has landed
    /// ([`Self::landed`]), readers read the table at `after` at most, and
    /// those that started before it landed never see it. So a transaction
    /// reads every table as of its BEGIN, as far as this process's commits
    /// go.
    pub fn landing(&self, location: &str, after: i64) -> CommitTicket {
        self.begin(HashMap::from([(location.to_string(), after + 1)]))
    }

    /// The commit of `ticket` (see [`Self::landing`]) landed as `version`,
    /// or (None) did not land.
    pub fn landed(&self, ticket: CommitTicket, location: &str, version: Option<i64>) {
        let mut registry = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match version {
            Some(version) => {
                if let Some(commit) = registry.commits.iter_mut().find(|c| c.id == ticket.id) {
                    commit
                        .versions
                        .insert(location.trim_matches('/').to_string(), version);
                }
                registry.finish(ticket.id);
            }
            None => registry.commits.retain(|c| c.id != ticket.id),
        }
        drop(registry);
        // Finished above, or gone: its drop finds nothing left to do.
        drop(ticket);
    }

    /// The version of the table at `location` a reader that started at
    /// `epoch` reads, where the newest version is `latest`: None for the
    /// newest, else the version before the earliest multi-table commit of
    /// the table that the reader must not see.
    pub fn visible(&self, location: &str, latest: i64, epoch: u64) -> Option<i64> {
        let registry = self.state.lock().unwrap_or_else(|e| e.into_inner());
        registry
            .commits
            .iter()
            .filter(|c| c.finished.is_none_or(|finished| finished > epoch))
            .filter_map(|c| c.versions.get(location.trim_matches('/')))
            .filter(|version| **version <= latest)
            .map(|version| version - 1)
            .min()
    }
}

/// Directory (under the data location) of the intents of commits over
/// several tables.
pub const INTENT_DIR: &str = "_cirro_txns";

/// What a commit over several tables does to each table, written before its
/// first commit so that a crash part-way can be finished.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Intent {
    pub id: String,
    pub tables: Vec<IntentTable>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IntentTable {
    /// The table's directory, relative to the data location.
    pub location: String,
    /// The newest version when the commit began: its commit is above it.
    pub after: i64,
    pub actions: Vec<deltalake::kernel::Action>,
    /// What undoes `actions`.
    pub inverse: Vec<deltalake::kernel::Action>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions(pairs: &[(&str, i64)]) -> HashMap<String, i64> {
        pairs.iter().map(|(l, v)| (l.to_string(), *v)).collect()
    }

    #[test]
    fn a_commit_is_seen_whole_by_readers_that_start_after_it() {
        let commits = MultiCommits::default();
        let before = commits.reader();
        let ticket = commits.begin(versions(&[("a", 5), ("b", 8)]));
        // Landing: a's version is in, b's not yet.
        let during = commits.reader();
        assert_eq!(commits.visible("a", 5, during.epoch()), Some(4));
        assert_eq!(commits.visible("b", 7, during.epoch()), None);
        assert_eq!(commits.visible("c", 3, during.epoch()), None);
        commits.finish(ticket);
        let after = commits.reader();
        assert_eq!(commits.visible("a", 5, after.epoch()), None);
        assert_eq!(commits.visible("b", 8, after.epoch()), None);
        // Readers that started before it still do not see it, even with
        // later single-table commits on top.
        assert_eq!(commits.visible("a", 6, before.epoch()), Some(4));
        assert_eq!(commits.visible("b", 8, during.epoch()), Some(7));
    }

    #[test]
    fn finished_commits_are_forgotten_once_no_reader_needs_them() {
        let commits = MultiCommits::default();
        let old = commits.reader();
        commits.finish(commits.begin(versions(&[("a", 2)])));
        assert_eq!(commits.visible("a", 2, old.epoch()), Some(1));
        drop(old);
        let registry = commits.state.lock().expect("lock");
        assert!(registry.commits.is_empty());
        assert!(registry.readers.is_empty());
    }

    #[test]
    fn a_single_table_commit_is_hidden_from_readers_that_started_before_it() {
        let commits = MultiCommits::default();
        let before = commits.reader();
        let ticket = commits.landing("a", 4);
        // On its way: nobody sees above 4, whatever version it gets.
        let during = commits.reader();
        assert_eq!(commits.visible("a", 5, during.epoch()), Some(4));
        assert_eq!(commits.visible("a", 4, during.epoch()), None);
        commits.landed(ticket, "a", Some(6)); // another process's is 5
        let after = commits.reader();
        assert_eq!(commits.visible("a", 6, after.epoch()), None);
        assert_eq!(commits.visible("a", 6, before.epoch()), Some(5));
        assert_eq!(commits.visible("a", 6, during.epoch()), Some(5));
        assert_eq!(commits.visible("b", 3, before.epoch()), None);
        // One that did not land hides nothing, from anyone.
        let failed = commits.landing("b", 3);
        commits.landed(failed, "b", None);
        assert_eq!(commits.visible("b", 4, before.epoch()), None);
        drop((before, during, after));
        let registry = commits.state.lock().expect("lock");
        assert!(registry.commits.is_empty());
    }

    #[test]
    fn a_dropped_ticket_finishes_its_commit() {
        let commits = MultiCommits::default();
        drop(commits.begin(versions(&[("a", 2)])));
        let reader = commits.reader();
        assert_eq!(commits.visible("a", 2, reader.epoch()), None);
    }
}
