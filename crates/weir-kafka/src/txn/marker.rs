//! The value of a commit marker: which lineage, subtask, epoch and transaction it closes.

use std::fmt::Write as _;

/// What a commit marker says. A marker is written in the transaction it closes, so a
/// `read_committed` reader sees it exactly when that transaction committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerValue {
    /// A marker of this weir.
    Closes {
        /// The lineage token of the sink that wrote the epoch.
        lineage: u64,
        /// The subtask that wrote the epoch.
        subtask: u32,
        /// The checkpoint whose barrier closed the epoch.
        epoch: u64,
        /// The epoch's transaction token (the same when a restore writes the epoch again).
        token: u64,
        /// 0 for the marker written with the epoch; a random id for a copy a restore wrote
        /// (so that a copy is never mistaken for the original at the original's offset).
        copy: u64,
    },
    /// A marker of weir versions before sink identities: its value was the checkpoint id.
    Legacy {
        /// The checkpoint id.
        epoch: u64,
    },
}

impl MarkerValue {
    /// The marker's text.
    ///
    /// ```
    /// use weir_kafka::txn::MarkerValue;
    /// let m = MarkerValue::Closes { lineage: 0xab, subtask: 2, epoch: 7, token: 9, copy: 0 };
    /// assert_eq!(
    ///     m.encode(),
    ///     "weir2 lineage=00000000000000ab subtask=2 epoch=7 txn=0000000000000009 copy=0"
    /// );
    /// assert_eq!(MarkerValue::parse(m.encode().as_bytes()), Some(m));
    /// assert_eq!(MarkerValue::parse(b"41"), Some(MarkerValue::Legacy { epoch: 41 }));
    /// assert_eq!(MarkerValue::parse(b"weir2 lineage=zz"), None);
    /// ```
    pub fn encode(&self) -> String {
        match *self {
            MarkerValue::Closes {
                lineage,
                subtask,
                epoch,
                token,
                copy,
            } => {
                let mut s = String::with_capacity(100);
                let _ = write!(
                    s,
                    "weir2 lineage={lineage:016x} subtask={subtask} epoch={epoch} \
                     txn={token:016x} copy={copy:x}"
                );
                s
            }
            MarkerValue::Legacy { epoch } => epoch.to_string(),
        }
    }

    /// Reads a marker's value; `None` when it is neither format.
    pub fn parse(value: &[u8]) -> Option<MarkerValue> {
        let text = std::str::from_utf8(value).ok()?;
        if let Ok(epoch) = text.parse::<u64>() {
            return Some(MarkerValue::Legacy { epoch });
        }
        let mut parts = text.split(' ');
        if parts.next()? != "weir2" {
            return None;
        }
        let (mut lineage, mut subtask, mut epoch, mut token) = (None, None, None, None);
        let mut copy = 0;
        for part in parts {
            match part.split_once('=')? {
                ("lineage", v) => lineage = Some(u64::from_str_radix(v, 16).ok()?),
                ("subtask", v) => subtask = Some(v.parse().ok()?),
                ("epoch", v) => epoch = Some(v.parse().ok()?),
                ("txn", v) => token = Some(u64::from_str_radix(v, 16).ok()?),
                ("copy", v) => copy = u64::from_str_radix(v, 16).ok()?,
                _ => {}
            }
        }
        Some(MarkerValue::Closes {
            lineage: lineage?,
            subtask: subtask?,
            epoch: epoch?,
            token: token?,
            copy,
        })
    }

    /// The checkpoint id the marker names.
    pub fn epoch(&self) -> u64 {
        match *self {
            MarkerValue::Closes { epoch, .. } | MarkerValue::Legacy { epoch } => epoch,
        }
    }
}
