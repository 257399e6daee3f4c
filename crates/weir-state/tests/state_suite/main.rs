//! One state test suite, run against every keyed state backend: the memory backend and
//! (with the `rocksdb` feature) the RocksDB backend, on real databases in a temporary
//! directory with a write-back cache far smaller than the state. Each case is a generic
//! function of [`harness::Harness`]; `suite!` runs every case against one backend.

mod cases;
mod harness;
mod large;

macro_rules! suite {
    ($backend:ident, $make:expr, $large:expr) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::harness::*;

            #[test]
            fn value_state_is_per_key() {
                super::cases::value_state_is_per_key(&$make);
            }
            #[test]
            fn list_state_adds_updates_and_clears() {
                super::cases::list_state_adds_updates_and_clears(&$make);
            }
            #[test]
            fn map_state_puts_gets_removes_and_clears() {
                super::cases::map_state_puts_gets_removes_and_clears(&$make);
            }
            #[test]
            fn iteration_reads_every_element_once() {
                super::cases::iteration_reads_every_element_once(&$make);
            }
            #[test]
            fn ttl_hides_what_expired() {
                super::cases::ttl_hides_what_expired(&$make);
            }
            #[test]
            fn a_restore_gives_the_state_at_the_checkpoint() {
                super::cases::a_restore_gives_the_state_at_the_checkpoint(&$make);
            }
            #[test]
            fn a_restore_at_another_parallelism_gives_each_key_to_its_owner() {
                super::cases::a_restore_at_another_parallelism_gives_each_key_to_its_owner(&$make);
            }
            #[test]
            fn a_million_map_entries_and_list_elements_under_one_key() {
                super::large::a_million_map_entries_and_list_elements_under_one_key(&$large);
            }
        }
    };
}

suite!(memory, Memory::new(), Memory::new());
// The large case under a cache of 1,024 entries: a thousandth of the collection.
#[cfg(feature = "rocksdb")]
suite!(rocksdb, Rocks::new(), Rocks::with_cache(1024));
