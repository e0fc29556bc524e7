-- Databases and the least-privilege service account for the billing
-- service. Applied as root by `scripts/services.sh up` on every start, so
-- every statement here must be idempotent.
--
-- The account gets DML and the DDL its schema migrations need on the two
-- shard databases, and nothing server-wide. DROP is also the running
-- service's own need: it empties a dedup key table whose keys have all
-- expired with TRUNCATE TABLE, which needs DROP.
--
-- XA RECOVER: on MariaDB 10.11 it needs NO privilege at all. Tested as
-- 'billing' with only the grants below: XA RECOVER lists every prepared XA
-- transaction on the server (also other users'), and XA COMMIT / XA ROLLBACK
-- of such an xid succeed as well. (MySQL 8.x instead requires
-- XA_RECOVER_ADMIN for XA RECOVER; MariaDB has no such privilege, so a
-- MySQL deployment must add `GRANT XA_RECOVER_ADMIN ON *.* TO 'billing'@'%'`.)
-- services.sh checks after applying this file that 'billing' can run
-- XA RECOVER over TCP.
--
-- 'billing'@'%': the server listens on 127.0.0.1 only and runs with
-- skip-name-resolve, where a TCP client from 127.0.0.1 matches a '%' or
-- '127.0.0.1' host but never 'localhost'.

CREATE DATABASE IF NOT EXISTS `billing`;
CREATE DATABASE IF NOT EXISTS `billing_shard1`;

CREATE USER IF NOT EXISTS 'billing'@'%' IDENTIFIED BY 'billing';
-- Resets the password should the account exist with another one.
ALTER USER 'billing'@'%' IDENTIFIED BY 'billing';

GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX, DROP, REFERENCES
    ON `billing`.* TO 'billing'@'%';
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX, DROP, REFERENCES
    ON `billing_shard1`.* TO 'billing'@'%';
