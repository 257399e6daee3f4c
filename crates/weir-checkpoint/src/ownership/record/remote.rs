//! Owner records on object storage, where there is no exclusive create.
//!
//! Record `seq` of a run is the object `.weir-owners/<seq as 20 digits>-<token>`: a level of
//! its own, so that reading the records lists only them (an output prefix may hold
//! thousands of committed objects, and a run reads its records at every renewal). To create
//! it exclusively, a run writes its object and then lists every object of that number: it
//! has created the record when its own is the only one, and otherwise deletes its own and
//! reports the number taken. Of two runs writing the same number, at most one sees only
//! itself: PUT and LIST are linearizable (S3 and the stores `object_store` serves are
//! strongly consistent), so whichever lists second sees the other's object. Both may lose
//! (each sees the other), and then both try again at their next step, as after a lost
//! race on a file system. No conditional write (`If-None-Match`) is needed, so servers that
//! ignore them (S3Proxy) are as safe as S3.
//!
//! A loser's object exists for the moment between its PUT and its DELETE (or longer if
//! the loser crashed in between). A reader that finds several objects of the highest number
//! takes the oldest by the server's clock (ties by token) after looking again once, and the
//! run that created the record always recognises its own: a stray loser can delay a
//! take-over, never hand the directory to two runs.

use super::{OwnerRecord, Seen};
use crate::error::Result;
use std::path::Path;
use weir_objstore::Store;

fn store(dir: &Path) -> Result<Store> {
    crate::storage::remote::open(dir)
}

/// The level of the owner records on object storage.
pub(crate) const RECORDS: &str = ".weir-owners/";

fn object(seq: u64, token: &str) -> String {
    format!("{RECORDS}{seq:020}-{token}")
}

/// `(seq, token, modified_ms)` of every record object.
fn records(store: &Store) -> Result<Vec<(u64, String, i64)>> {
    let mut out = Vec::new();
    for o in store.list(RECORDS)? {
        let Some(rest) = o.name.strip_prefix(RECORDS) else {
            continue;
        };
        let Some((digits, token)) = rest.split_once('-') else {
            continue;
        };
        if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) || token.is_empty() {
            continue;
        }
        if let Ok(seq) = digits.parse() {
            out.push((seq, token.to_string(), o.modified_ms));
        }
    }
    Ok(out)
}

pub(crate) fn list(dir: &Path) -> Result<Vec<u64>> {
    let mut seqs: Vec<u64> = records(&store(dir)?)?.into_iter().map(|r| r.0).collect();
    seqs.sort_unstable();
    seqs.dedup();
    Ok(seqs)
}

pub(crate) fn read_current(dir: &Path) -> Result<Seen> {
    let store = store(dir)?;
    for attempt in 0..10 {
        let all = records(&store)?;
        let Some(top) = all.iter().map(|r| r.0).max() else {
            return Ok(Seen::Nothing);
        };
        let mut at_top: Vec<&(u64, String, i64)> = all.iter().filter(|r| r.0 == top).collect();
        if at_top.len() > 1 && attempt == 0 {
            // Most likely a loser about to delete its object: look again.
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        }
        at_top.sort_by(|a, b| (a.2, &a.1).cmp(&(b.2, &b.1)));
        let (seq, token, _) = at_top[0];
        // Our own record wins for us: we saw it alone when we created it.
        let mine = at_top.iter().find(|r| super::created_here(dir, r.0, &r.1));
        let (seq, token) = mine.map_or((*seq, token.as_str()), |r| (r.0, r.1.as_str()));
        match store.get(&object(seq, token))? {
            Some(bytes) => {
                return Ok(match serde_json::from_slice::<OwnerRecord>(&bytes) {
                    Ok(record) => Seen::Record { seq, record },
                    Err(_) => Seen::Unreadable { seq },
                });
            }
            // Deleted between the listing and the read (a loser, or clean-up): list again.
            None => continue,
        }
    }
    Err(crate::error::Error::io(
        "read the owner record of",
        dir,
        std::io::Error::other("records keep disappearing while being read"),
    ))
}

pub(crate) fn create(dir: &Path, seq: u64, token: &str, json: Vec<u8>) -> Result<bool> {
    let store = store(dir)?;
    let mine = object(seq, token);
    store.put(&mine, json)?;
    let others = records(&store)?
        .into_iter()
        .any(|(s, t, _)| s == seq && t != token);
    if others {
        store.delete(&mine)?;
        return Ok(false);
    }
    super::remember_created(dir, seq, token);
    Ok(true)
}

pub(crate) fn delete_below(dir: &Path, below: u64) {
    let Ok(store) = store(dir) else { return };
    let Ok(all) = records(&store) else { return };
    for (seq, token, _) in all.into_iter().filter(|r| r.0 < below) {
        let _ = store.delete(&object(seq, &token));
    }
}
