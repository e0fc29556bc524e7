-- Database and least-privilege account of the billing service on MySQL 8.4,
-- for docker-compose.yml (and MariaDB 10.11, which stands in for it where
-- MySQL 8.4 cannot run). The mysql image runs the files of
-- /docker-entrypoint-initdb.d once, as root, when it initialises an empty
-- data directory (a fresh `mysql-data` volume). After editing this file,
-- recreate the volume: `docker compose down -v && docker compose up -d`.
--
-- Keep in step with the MariaDB variant, scripts/mariadb/grants.sql.
--
-- The password must match MYSQL_DSN in docker-compose.yml and the mysql
-- healthcheck there. 'billing' is a development credential: change all of
-- them together for anything else.

CREATE DATABASE IF NOT EXISTS `billing`;

CREATE USER IF NOT EXISTS 'billing'@'%' IDENTIFIED BY 'billing';

-- DML, and the DDL of the schema migrations the service applies at start
-- (goose, with its lock and version tables in the same database). DROP is
-- also the running service's own need: it empties a dedup key table whose
-- keys have all expired with TRUNCATE TABLE, which needs DROP.
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX, DROP, REFERENCES
    ON `billing`.* TO 'billing'@'%';

-- XA RECOVER (recovery lists prepared XA branches to resolve them) needs
-- this dynamic global privilege on MySQL 8.x. MariaDB has no such privilege
-- and needs none: the statement is a versioned comment that MySQL 8.0+
-- runs and MariaDB skips (MariaDB ignores /*!8xxxx ... */), so the file
-- serves both servers (the local MariaDB image of scripts/images/ runs it in
-- CI's compose demo).
/*!80000 GRANT XA_RECOVER_ADMIN ON *.* TO 'billing'@'%' */;
