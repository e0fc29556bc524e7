-- Versions of an event (docs/corrections.md): a key's row keeps the
-- version of its event the ledger counts, so that a later version can
-- retract it: its revision, and its account, currency, amount and time, or
-- that it is cancelled, in package dedup's compact encoding
-- (dedup.EncodeVersion, at most 103 bytes; about 20 plus the account id's
-- length for a typical key).
--
-- NULL is a key stored before this migration: what it counted is not
-- known, and a later revision of its event is a dead letter
-- (version_past_horizon) until the key expires. A column added last, with
-- no default to write: the ALTER is instant on MariaDB 10.3+ and MySQL 8.0+,
-- whatever the tables hold.

-- +goose Up
ALTER TABLE dedup_keys ADD COLUMN version VARBINARY(103) NULL;
ALTER TABLE dedup_keys_g1 ADD COLUMN version VARBINARY(103) NULL;
ALTER TABLE dedup_keys_g2 ADD COLUMN version VARBINARY(103) NULL;

-- +goose Down
ALTER TABLE dedup_keys_g2 DROP COLUMN version;
ALTER TABLE dedup_keys_g1 DROP COLUMN version;
ALTER TABLE dedup_keys DROP COLUMN version;
