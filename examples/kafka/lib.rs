//! Holds no code: the package exists for the Kafka examples (see Cargo.toml).
