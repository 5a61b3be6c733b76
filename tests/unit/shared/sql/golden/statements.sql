-- Every statement form of the dialect, applied in order to one metastore.
-- tests/unit/shared/sql/test_golden.py renders what each does into statements.golden.

-- Declared sources: streams with and without a key, a table, every type, both value formats.
CREATE STREAM readings (sensor VARCHAR KEY, area VARCHAR, reading INT, ts BIGINT)
  WITH (kafka_topic='readings', partitions=4, value_format='json', timestamp='ts');
CREATE STREAM IF NOT EXISTS readings (x INT) WITH (kafka_topic='other', value_format='json');
CREATE STREAM clicks (userid BIGINT, pageid STRING) WITH (kafka_topic='clicks', partitions=2, value_format='DELIMITED');
CREATE TABLE users (id VARCHAR PRIMARY KEY, name VARCHAR, age INT, balance DECIMAL(10, 2),
  tags ARRAY<VARCHAR>, attrs MAP<VARCHAR, INT>, address STRUCT<city VARCHAR, zip INT>,
  avatar BYTES, born DATE, seen TIMESTAMP, active BOOLEAN, score DOUBLE)
  WITH (kafka_topic='users', partitions=4, value_format='json');
CREATE OR REPLACE STREAM clicks (userid BIGINT, pageid STRING, referrer STRING)
  WITH (kafka_topic='clicks', partitions=2, value_format='DELIMITED');
CREATE STREAM `MixedCase` ("Quoted" VARCHAR KEY, plain INT) WITH (kafka_topic='mixed', partitions=1, value_format='json');

-- Persistent queries: CTAS with every aggregate, CSAS with projection, functions and PARTITION BY.
CREATE TABLE avg_readings AS
  SELECT sensor, AVG(reading) AS avg_reading, COUNT(*) AS n, SUM(reading) AS total, MIN(reading) AS low,
         MAX(reading) AS high, LATEST_BY_OFFSET(area) AS last_area, EARLIEST_BY_OFFSET(area) AS first_area,
         COUNT_DISTINCT(area) AS areas, COLLECT_LIST(reading) AS all_readings
  FROM readings WHERE reading IS NOT NULL AND area != 'test' GROUP BY sensor EMIT CHANGES;
CREATE TABLE by_area WITH (kafka_topic='by_area_topic', partitions=2) AS
  SELECT area, COUNT(*) AS n FROM readings GROUP BY area;
CREATE STREAM hot WITH (value_format='DELIMITED') AS
  SELECT sensor, UCASE(area) AS area, reading * 2 AS doubled, CASE WHEN reading > 50 THEN 'hot' ELSE 'cold' END AS band
  FROM readings r WHERE r.reading BETWEEN 40 AND 100 OR area IN ('engine', 'motor') EMIT CHANGES;
CREATE STREAM by_user WITH (partitions=3, kafka_topic='by_user') AS
  SELECT userid, pageid, LEN(pageid) AS len, CONCAT(pageid, '-', referrer) AS path FROM clicks PARTITION BY userid;
CREATE STREAM keyless AS SELECT userid, pageid FROM clicks;
CREATE STREAM hot_copy AS SELECT * FROM hot;
INSERT INTO hot_copy SELECT sensor, LCASE(area) AS area, reading AS doubled, 'copied' AS band FROM readings;
CREATE TABLE adults AS SELECT id, name, address->city AS city, tags[1] AS first_tag, attrs['k'] AS k
  FROM users WHERE age >= 18;
CREATE OR REPLACE STREAM hot AS
  SELECT sensor, UCASE(area) AS area, reading * 2 AS doubled, CASE WHEN reading > 50 THEN 'hot' ELSE 'cold' END AS band,
         reading % 7 AS bucket
  FROM readings WHERE reading BETWEEN 40 AND 100;
CREATE OR REPLACE TABLE by_area AS SELECT area, COUNT(*) AS n FROM readings WHERE area != 'test' GROUP BY area;

-- Rejected statements: nothing changes.
CREATE STREAM readings (sensor VARCHAR KEY) WITH (kafka_topic='readings', value_format='json');
CREATE TABLE nokey (a INT) WITH (kafka_topic='nokey', value_format='json');
CREATE STREAM badfmt (a INT) WITH (kafka_topic='badfmt', value_format='avro');
CREATE STREAM badprop (a INT) WITH (kafka_topic='badprop', value_format='json', colour='red');
CREATE STREAM twice (a INT, a INT) WITH (kafka_topic='twice', value_format='json');
CREATE STREAM cased ("a" INT, A INT) WITH (kafka_topic='cased', value_format='json');
CREATE STREAM cased ("rowtime" BIGINT, a INT) WITH (kafka_topic='cased', value_format='json');
CREATE STREAM nested (k VARCHAR KEY, tags ARRAY<VARCHAR>) WITH (kafka_topic='nested', value_format='delimited');
CREATE TABLE nested_copy WITH (value_format='delimited') AS SELECT id, address FROM users;
CREATE STREAM mapkey (m MAP<VARCHAR, INT> KEY) WITH (kafka_topic='mapkey', value_format='json');
CREATE TABLE ghosts AS SELECT id, COUNT(*) FROM ghost GROUP BY id;
CREATE TABLE t1 AS SELECT sensor, SUM(area) AS s FROM readings GROUP BY sensor;
CREATE TABLE t2 AS SELECT sensor, AVG(nope) AS s FROM readings GROUP BY sensor;
CREATE TABLE t3 AS SELECT sensor, area, COUNT(*) FROM readings GROUP BY sensor;
CREATE TABLE t4 AS SELECT COUNT(*) AS n FROM readings GROUP BY sensor;
CREATE TABLE t5 WITH (key_format='kafka') AS SELECT sensor, area, COUNT(*) FROM readings GROUP BY sensor, area;
CREATE STREAM s1 AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor;
CREATE STREAM s2 AS SELECT sensor, reading + area AS x FROM readings;
CREATE STREAM s3 AS SELECT sensor, reading FROM readings WHERE reading;
CREATE STREAM s4 AS SELECT sensor, NOSUCH(area) FROM readings;
CREATE STREAM s5 AS SELECT sensor, SUBSTRING(area) FROM readings;
CREATE STREAM s6 AS SELECT area FROM readings;
CREATE STREAM s7 AS SELECT sensor, area AS sensor FROM readings;
CREATE STREAM s8 AS SELECT sensor, x.area FROM readings r;
CREATE STREAM s9 AS SELECT id, name FROM users;
CREATE TABLE t6 AS SELECT userid, pageid FROM clicks;
CREATE STREAM s10 AS SELECT sensor, reading FROM readings LIMIT 5;
CREATE STREAM s11 AS SELECT sensor, reading = 'x' AS y FROM readings;
INSERT INTO hot_copy SELECT sensor, area FROM readings;
INSERT INTO avg_readings SELECT sensor, reading FROM readings;
CREATE OR REPLACE STREAM readings (sensor VARCHAR KEY, area INT) WITH (kafka_topic='readings', partitions=4, value_format='json');
CREATE OR REPLACE TABLE users (id VARCHAR PRIMARY KEY) WITH (kafka_topic='users', partitions=4, value_format='json');
CREATE OR REPLACE TABLE by_area AS SELECT area, COUNT(*) AS n, SUM(reading) AS total FROM readings GROUP BY area;
CREATE OR REPLACE TABLE by_area AS SELECT area, COUNT_DISTINCT(sensor) AS n FROM readings GROUP BY area;
CREATE OR REPLACE TABLE by_area AS SELECT UCASE(area) AS area, COUNT(*) AS n FROM readings GROUP BY UCASE(area);
EXPLAIN CREATE OR REPLACE TABLE by_area AS SELECT area, COUNT(*) AS n, MAX(reading) AS top FROM readings GROUP BY area;

-- Windowed aggregations: TUMBLING and HOPPING windows over event time (readings' TIMESTAMP column,
-- clicks' record timestamps), their pull and push queries, views, and what is refused.
CREATE TABLE per_minute AS
  SELECT sensor, AVG(reading) AS avg_reading, COUNT(*) AS n FROM readings
  WINDOW TUMBLING (SIZE 1 MINUTE, RETENTION 2 HOURS, GRACE PERIOD 10 SECONDS) GROUP BY sensor EMIT CHANGES;
CREATE TABLE area_hops AS SELECT area, MAX(reading) AS top, COLLECT_LIST(sensor) AS sensors FROM readings
  WINDOW HOPPING (SIZE 5 MINUTES, ADVANCE BY 1 MINUTE) GROUP BY area;
CREATE TABLE clicks_per_hour AS SELECT userid, COUNT(*) AS n FROM clicks WINDOW TUMBLING (SIZE 1 HOUR) GROUP BY userid;
SELECT * FROM per_minute WHERE sensor = 's1' AND WINDOWSTART >= 0 AND WINDOWEND <= 3600000;
SELECT sensor, WINDOWSTART AS ws, avg_reading FROM per_minute WHERE WINDOWSTART > 60000;
SELECT * FROM area_hops WHERE area = 'engine' EMIT CHANGES;
DESCRIBE per_minute;
DESCRIBE EXTENDED area_hops;
EXPLAIN CREATE TABLE per_two AS SELECT sensor, COUNT(*) AS n FROM readings WINDOW TUMBLING (SIZE 2 MINUTES) GROUP BY sensor;
CREATE OR REPLACE TABLE per_minute AS
  SELECT sensor, AVG(reading) AS avg_reading, COUNT(*) AS n FROM readings
  WINDOW TUMBLING (SIZE 2 MINUTES, RETENTION 2 HOURS, GRACE PERIOD 10 SECONDS) GROUP BY sensor;
CREATE OR REPLACE TABLE per_minute AS
  SELECT sensor, AVG(reading) AS avg_reading, COUNT(*) AS n FROM readings GROUP BY sensor;
CREATE TABLE w1 AS SELECT sensor, reading FROM readings WINDOW TUMBLING (SIZE 1 MINUTE);
CREATE TABLE w2 AS SELECT id, COUNT(*) AS n FROM users WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY id;
CREATE TABLE w3 AS SELECT sensor, COUNT(*) AS n FROM readings WINDOW TUMBLING (SIZE 0 SECONDS) GROUP BY sensor;
CREATE TABLE w4 AS SELECT sensor, COUNT(*) AS n FROM readings WINDOW HOPPING (SIZE 1 MINUTE, ADVANCE BY 2 MINUTES) GROUP BY sensor;
CREATE TABLE w5 AS SELECT sensor, COUNT(*) AS n FROM readings
  WINDOW TUMBLING (SIZE 1 MINUTE, RETENTION 30 SECONDS, GRACE PERIOD 10 SECONDS) GROUP BY sensor;
CREATE TABLE sessions AS SELECT sensor, COUNT(*) AS n, MAX(reading) AS top FROM readings
  WINDOW SESSION (5 MINUTES, GRACE PERIOD 1 MINUTE) GROUP BY sensor;
SELECT * FROM sessions WHERE sensor = 's1' AND WINDOWEND > 1000;
DESCRIBE EXTENDED sessions;
CREATE TABLE w6 AS SELECT sensor, COUNT(*) AS n FROM readings WINDOW SESSION (5 MINUTES) GROUP BY sensor EMIT FINAL;
CREATE TABLE w9 AS SELECT sensor, COUNT(*) AS n FROM readings WINDOW SESSION (0 SECONDS) GROUP BY sensor;
CREATE TABLE w7 AS SELECT sensor, COUNT(*) AS n FROM readings WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY sensor EMIT FINAL;
CREATE TABLE w8 AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor EMIT FINAL;
CREATE STREAM w11 AS SELECT * FROM per_minute;
CREATE STREAM logins (userid VARCHAR KEY, at VARCHAR)
  WITH (kafka_topic='logins', partitions=2, value_format='json', timestamp='at', timestamp_format='yyyy-MM-dd''T''HH:mm:ssX');
CREATE TABLE logins_per_hour AS SELECT userid, COUNT(*) AS n FROM logins WINDOW TUMBLING (SIZE 1 HOUR) GROUP BY userid;
EXPLAIN CTAS_LOGINS_PER_HOUR_14;
CREATE STREAM w12 (userid VARCHAR KEY, at VARCHAR) WITH (kafka_topic='w12', partitions=1, value_format='json',
  timestamp='at', timestamp_format='yyyy-MM-dd'' ); DROP TABLE x; --');
CREATE STREAM w13 (userid VARCHAR KEY, at BIGINT) WITH (kafka_topic='w13', partitions=1, value_format='json',
  timestamp_format='yyyy');
CREATE STREAM w14 (userid VARCHAR KEY, at BIGINT) WITH (kafka_topic='w14', partitions=1, value_format='json',
  timestamp='at', timestamp_format='yyyy');
CREATE STREAM w15 (userid VARCHAR KEY, rowtime BIGINT) WITH (kafka_topic='w15', partitions=1, value_format='json');
CREATE STREAM w16 (userid VARCHAR KEY, at VARCHAR) WITH (kafka_topic='w16', partitions=1, value_format='json',
  timestamp='at', timestamp_format='yyyy-MM-ddTHH:mm');
CREATE STREAM w17 (userid VARCHAR KEY, at VARCHAR) WITH (kafka_topic='w17', partitions=1, value_format='json',
  timestamp='at', timestamp_format='YYYY-ww');
CREATE TABLE w18 AS SELECT sensor, COUNT(*) AS n FROM readings WINDOW TUMBLING (SIZE 200000000000 DAYS) GROUP BY sensor;
CREATE TABLE w19 AS SELECT sensor, COUNT(*) AS n FROM readings
  WINDOW HOPPING (SIZE 30 DAYS, ADVANCE BY 1 MILLISECOND) GROUP BY sensor;
CREATE TABLE w20 AS SELECT sensor, COUNT(*) AS n FROM readings
  WINDOW HOPPING (SIZE 20001 MILLISECONDS, ADVANCE BY 2 MILLISECONDS) GROUP BY sensor;

CREATE TABLE bounded AS SELECT sensor, WINDOWSTART AS ws, COUNT(*) AS n, WINDOWEND AS we FROM readings
  WINDOW HOPPING (SIZE 1 MINUTE, ADVANCE BY 30 SECONDS) GROUP BY sensor;
SELECT * FROM bounded WHERE sensor = 's1';
CREATE TABLE w20 AS SELECT sensor, WINDOWSTART, COUNT(*) AS n FROM readings WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY sensor;
CREATE TABLE w21 AS SELECT sensor, WINDOWSTART AS ws, COUNT(*) AS n FROM readings GROUP BY sensor;

-- ROWTIME: each record's timestamp, in persistent and push queries and settable by INSERT.
CREATE STREAM stamped AS SELECT sensor, ROWTIME AS rt, reading FROM readings WHERE ROWTIME > 1000;
CREATE TABLE latest_by_area AS SELECT area, MAX(ROWTIME) AS latest, COUNT(*) AS n FROM readings GROUP BY area;
EXPLAIN CTAS_LATEST_BY_AREA_17;
SELECT sensor, ROWTIME FROM readings WHERE ROWTIME >= 0 EMIT CHANGES;
SELECT sensor, ROWTIME FROM avg_readings;
INSERT INTO readings (ROWTIME, sensor, reading, ts) VALUES (1795000000000, 's9', 4, 1795000000000);
INSERT INTO readings (ROWTIME, sensor, reading) VALUES (-1, 's9', 4);
INSERT INTO readings (sensor, reading) VALUES ('s9', 2147483647 + 1);
INSERT INTO readings (ROWTIME, sensor, reading) VALUES (253402300800000, 's9', 4);
INSERT INTO readings (sensor, reading) VALUES ('s9', ABS(CAST(-2147483648 AS INT)));
SELECT sensor, COUNT(*) FROM readings WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY sensor;
SELECT * FROM per_minute EMIT FINAL;

-- HAVING: the groups whose aggregates pass it (the others are tombstones in the sink, absent from pulls).
EXPLAIN CREATE TABLE busy AS SELECT sensor, COUNT(*) AS n, AVG(reading) AS avg_reading FROM readings
  GROUP BY sensor HAVING COUNT(*) > 10 AND AVG(reading) < 50.5;
CREATE TABLE busy_areas AS SELECT area, COUNT(*) AS n FROM readings GROUP BY area HAVING area <> 'test' AND COUNT(*) > 1;
CREATE TABLE busy_minutes AS SELECT sensor, COUNT(*) AS n FROM readings WINDOW TUMBLING (SIZE 1 MINUTE)
  GROUP BY sensor HAVING COUNT(*) >= 2;
EXPLAIN CREATE TABLE h1 AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor HAVING SUM(reading) > 1;
CREATE TABLE h2 AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor HAVING reading > 1;
CREATE TABLE h3 AS SELECT sensor, reading FROM readings HAVING reading > 1;
CREATE TABLE h4 AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor HAVING COUNT(*);
SELECT * FROM avg_readings HAVING n > 1;

-- Expressions over aggregates: evaluated over the result row; aggregates no column selects are held apart.
EXPLAIN CREATE TABLE means AS SELECT sensor, COUNT(*) AS n, SUM(reading) / COUNT(*) AS mean, ROUND(AVG(reading), 2) AS avg2,
  CONCAT(sensor, ':', CAST(MAX(reading) AS VARCHAR)) AS tag FROM readings GROUP BY sensor HAVING COUNT(*) > 1;
CREATE TABLE m1 AS SELECT sensor, reading + COUNT(*) AS x FROM readings GROUP BY sensor;
EXPLAIN CREATE TABLE m2 AS SELECT sensor, COUNT(*) AS KSQL_AGG_VARIABLE_0, MAX(reading) - MIN(reading) AS spread FROM readings GROUP BY sensor;

-- Stream-table joins: each reading with its sensor's row as of the reading.
CREATE TABLE sensors (id VARCHAR PRIMARY KEY, site VARCHAR, area VARCHAR)
  WITH (kafka_topic='sensors', partitions=4, value_format='json');
CREATE STREAM enriched AS SELECT r.sensor, r.reading, s.site FROM readings r LEFT JOIN sensors s ON r.sensor = s.id;
EXPLAIN CREATE STREAM e_inner AS SELECT s.id, r.reading * 2 AS twice, site FROM readings r INNER JOIN sensors s
  ON s.id = r.sensor WHERE s.site <> 'lab' AND r.ROWTIME > 0;
CREATE STREAM by_area_joined WITH (partitions=2) AS SELECT * FROM readings JOIN users u ON readings.area = u.id;
EXPLAIN CREATE STREAM e_area AS SELECT r.area, r.sensor, u.name FROM readings r JOIN users u ON r.area = u.id;
DESCRIBE EXTENDED sensors;
DROP TABLE sensors;
SELECT * FROM readings r JOIN sensors s ON r.sensor = s.id EMIT CHANGES;
CREATE STREAM j1 AS SELECT area FROM readings r JOIN sensors s ON r.sensor = s.id;
CREATE STREAM j2 AS SELECT r.area FROM readings r JOIN sensors s ON r.sensor = s.id;
CREATE STREAM j3 AS SELECT r.sensor FROM readings r JOIN sensors s ON r.sensor = s.site;
CREATE STREAM j4 AS SELECT r.sensor FROM readings r JOIN sensors s ON r.sensor > s.id;
CREATE STREAM j5 AS SELECT r.sensor FROM readings r JOIN sensors s ON r.reading = s.id;
CREATE STREAM j6 AS SELECT r.sensor FROM readings r FULL OUTER JOIN sensors s ON r.sensor = s.id;
CREATE STREAM j7 AS SELECT r.sensor FROM readings r RIGHT JOIN sensors s ON r.sensor = s.id;
CREATE STREAM j8 AS SELECT r.sensor FROM readings r JOIN sensors s WITHIN 1 MINUTE ON r.sensor = s.id;
CREATE STREAM j9 AS SELECT r.sensor FROM readings r JOIN readings q ON r.sensor = q.sensor;
CREATE STREAM j10 AS SELECT r.sensor FROM readings r JOIN readings q WITHIN 1 MINUTE ON r.sensor = q.sensor;
CREATE STREAM j11 AS SELECT s.id FROM sensors s JOIN readings r ON r.sensor = s.id;
CREATE STREAM j12 AS SELECT u.id FROM users u JOIN sensors s ON u.id = s.id;
CREATE TABLE j13 AS SELECT r.sensor FROM readings r JOIN sensors s ON r.sensor = s.id;
CREATE STREAM j14 AS SELECT r.sensor FROM readings r JOIN sensors r ON r.sensor = r.id;
EXPLAIN CREATE STREAM j15 AS SELECT r.sensor, s.site, u.name FROM readings r JOIN sensors s ON r.sensor = s.id
  LEFT JOIN users u ON u.id = r.sensor;
EXPLAIN CREATE STREAM j23 AS SELECT r.area, r.sensor, s.site, u.name FROM readings r JOIN sensors s ON r.sensor = s.id
  LEFT JOIN users u ON r.area = u.id;
EXPLAIN CREATE STREAM j24 AS SELECT u.id, r.sensor FROM readings r JOIN sensors s ON r.sensor = s.id JOIN users u ON s.site = u.id;
CREATE STREAM j25 AS SELECT r.sensor, area FROM readings r JOIN sensors s ON r.sensor = s.id JOIN users u ON r.sensor = u.id;
CREATE STREAM j26 AS SELECT r.sensor FROM readings r JOIN sensors s ON r.sensor = s.id JOIN users s ON r.sensor = s.id;
CREATE STREAM j27 AS SELECT r.sensor FROM readings r JOIN sensors s ON r.sensor = s.id LEFT JOIN sensors t ON r.sensor = t.id;
CREATE STREAM j28 AS SELECT r.sensor FROM readings r JOIN sensors r_sensor ON r.sensor = r_sensor.id;
CREATE STREAM o (k VARCHAR KEY, info_id INT) WITH (kafka_topic='o', partitions=4, value_format='json');
CREATE TABLE o_info (id INT PRIMARY KEY, v INT) WITH (kafka_topic='o_info', partitions=4, value_format='json');
CREATE STREAM j29 AS SELECT o.k FROM o JOIN o_info ON o.info_id = o_info.id;
CREATE STREAM j16 AS SELECT r.sensor, x.site FROM readings r JOIN sensors s ON r.sensor = s.id;
CREATE STREAM j17 AS SELECT r.sensor, s.nope FROM readings r JOIN sensors s ON r.sensor = s.id;
CREATE STREAM j18 AS SELECT r.sensor FROM readings r JOIN per_minute p ON r.sensor = p.sensor;
CREATE STREAM j19 AS SELECT r.sensor, COUNT(*) AS n FROM readings r JOIN sensors s ON r.sensor = s.id GROUP BY r.sensor;
EXPLAIN CREATE TABLE jg1 AS SELECT r.sensor, COUNT(*) * 2 AS n2, MAX(r.reading) - MIN(r.reading) AS spread FROM readings r
  JOIN sensors s ON r.sensor = s.id GROUP BY r.sensor HAVING MAX(r.reading) > 1;
EXPLAIN CREATE TABLE jg2 AS SELECT r.sensor, MAX(r.reading) - MAX(reading) AS x FROM readings r JOIN sensors s
  ON r.sensor = s.id GROUP BY r.sensor;
CREATE STREAM j20 AS SELECT c.pageid FROM clicks c JOIN sensors s ON c.pageid = s.id;
CREATE STREAM j21 AS SELECT r.sensor, s.site AS sensor FROM readings r JOIN sensors s ON r.sensor = s.id;
CREATE STREAM j22 AS SELECT r.sensor, r.reading / 0 AS broken FROM readings r LEFT JOIN sensors s ON r.sensor = s.id;

-- Table-table joins on the primary key: each key's rows of both tables, kept as either side changes.
CREATE TABLE sites (id VARCHAR PRIMARY KEY, city VARCHAR) WITH (kafka_topic='sites', partitions=4, value_format='json');
EXPLAIN CREATE TABLE sensor_cities AS SELECT s.id, s.site, t.city FROM sensors s LEFT JOIN sites t ON s.id = t.id;
CREATE TABLE sensor_cities AS SELECT s.id, s.site, t.city FROM sensors s FULL OUTER JOIN sites t ON s.id = t.id
  WHERE t.city IS NULL OR t.city <> 'nowhere';
DESCRIBE EXTENDED sensor_cities;
SELECT * FROM sensor_cities WHERE id = 's1';
CREATE TABLE tt1 AS SELECT * FROM sensors s JOIN sites t ON s.id = t.id;
CREATE TABLE tt2 AS SELECT t.id, s.site, t.city, o.city AS other FROM sensors s RIGHT JOIN sites t ON s.id = t.id
  INNER JOIN sites_too o ON s.id = o.id;
CREATE TABLE sites_too (id VARCHAR PRIMARY KEY, city VARCHAR) WITH (kafka_topic='sites_too', partitions=4, value_format='json');
CREATE TABLE tt3 AS SELECT t.id, s.site, t.city, o.city AS other FROM sensors s RIGHT JOIN sites t ON s.id = t.id
  INNER JOIN sites_too o ON s.id = o.id;
CREATE TABLE tt4 AS SELECT s.id FROM sensors s JOIN sites t ON s.site = t.id;
CREATE TABLE tt5 AS SELECT s.id FROM sensors s JOIN sites t ON s.id = t.city;
CREATE STREAM tt6 AS SELECT s.id FROM sensors s JOIN sites t ON s.id = t.id;
CREATE TABLE tt7 AS SELECT s.id FROM sensors s JOIN sites t WITHIN 1 MINUTE ON s.id = t.id;
CREATE TABLE tt8 WITH (partitions=2) AS SELECT s.id FROM sensors s JOIN sites t ON s.id = t.id;
CREATE TABLE tt9 AS SELECT s.id FROM sensors s JOIN per_minute p ON s.id = p.sensor;
CREATE TABLE tt10 AS SELECT s.site FROM sensors s JOIN sites t ON s.id = t.id;
CREATE TABLE tt11 AS SELECT s.id, MIN(t.city) AS n FROM sensors s JOIN sites t ON s.id = t.id GROUP BY s.id;
INSERT INTO sensor_cities SELECT s.id, s.site, t.city FROM sensors s JOIN sites t ON s.id = t.id;

-- Foreign-key table-table joins: each left row with the right row its column names, keyed by the left key.
CREATE TABLE sites3 (id VARCHAR PRIMARY KEY, city VARCHAR) WITH (kafka_topic='sites3', partitions=3, value_format='json');
EXPLAIN CREATE TABLE sensor_sites AS SELECT s.id, s.site, t.city FROM sensors s LEFT JOIN sites3 t ON s.site = t.id;
CREATE TABLE sensor_sites AS SELECT s.id, t.city, t.id AS site_id FROM sensors s JOIN sites3 t ON t.id = s.site
  WHERE t.city <> 'nowhere';
DESCRIBE EXTENDED sensor_sites;
CREATE TABLE fk1 AS SELECT s.id FROM sensors s FULL OUTER JOIN sites3 t ON s.site = t.id;
CREATE TABLE fk2 AS SELECT s.id FROM sensors s RIGHT JOIN sites3 t ON s.site = t.id;
CREATE TABLE fk3 AS SELECT t.id, t.city FROM sensors s JOIN sites3 t ON s.site = t.id;
CREATE TABLE fk4 AS SELECT s.id FROM sensors s JOIN sites3 t ON UCASE(s.site) = t.id;
EXPLAIN CREATE TABLE fk5 AS SELECT s.id FROM sensors s JOIN sites3 t ON s.site = t.id JOIN sites_too o ON s.id = o.id;
CREATE TABLE fk6 AS SELECT s.id FROM sensors s JOIN o_info i ON s.site = i.id;
CREATE TABLE fk7 WITH (partitions=3) AS SELECT s.id FROM sensors s JOIN sites3 t ON s.site = t.id;
CREATE STREAM fk8 AS SELECT s.id FROM sensors s JOIN sites3 t ON s.site = t.id;
DROP TABLE sites;

-- Stream-stream joins: records of two streams within a window of each other.
CREATE STREAM alerts (sensor VARCHAR KEY, level INT) WITH (kafka_topic='alerts', partitions=4, value_format='json');
EXPLAIN CREATE STREAM r_alerts AS SELECT r.sensor, r.reading, a.level FROM readings r LEFT JOIN alerts a
  WITHIN 10 SECONDS ON r.sensor = a.sensor;
CREATE STREAM r_alerts AS SELECT r.sensor, r.reading, a.level, r.ROWTIME AS at FROM readings r
  FULL OUTER JOIN alerts a WITHIN (5 SECONDS, 1 MINUTE) GRACE PERIOD 2 SECONDS ON a.sensor = r.sensor
  WHERE a.level IS NULL OR a.level > 1;
INSERT INTO r_alerts SELECT r.sensor, r.reading, a.level, r.ROWTIME AS at FROM readings r
  JOIN alerts a WITHIN 1 HOUR ON r.sensor = a.sensor;
CREATE STREAM ss1 AS SELECT r.sensor FROM readings r JOIN alerts a WITHIN 10 SECONDS ON r.area = a.sensor;
EXPLAIN CREATE STREAM ss2 AS SELECT r.sensor, s.site FROM readings r JOIN alerts a WITHIN 10 SECONDS
  ON r.sensor = a.sensor JOIN sensors s ON r.sensor = s.id;
CREATE TABLE ss3 AS SELECT r.sensor FROM readings r JOIN alerts a WITHIN 10 SECONDS ON r.sensor = a.sensor;
CREATE STREAM ss4 WITH (partitions=2) AS SELECT r.sensor FROM readings r JOIN alerts a WITHIN 10 SECONDS
  ON r.sensor = a.sensor;
CREATE STREAM ss5 AS SELECT r.sensor FROM readings r JOIN readings q WITHIN 10 SECONDS ON r.sensor = q.sensor;
CREATE STREAM area_alerts (id VARCHAR KEY, area VARCHAR, level INT)
  WITH (kafka_topic='area_alerts', partitions=4, value_format='json');
EXPLAIN CREATE STREAM by_area_alerts AS SELECT r.area, r.sensor, a.id, a.level FROM readings r
  LEFT JOIN area_alerts a WITHIN 1 MINUTE ON r.area = a.area;
CREATE STREAM by_area_alerts AS SELECT UCASE(r.area) AS area, r.sensor, a.id, a.level FROM readings r
  FULL OUTER JOIN area_alerts a WITHIN 1 MINUTE ON UCASE(r.area) = a.area;
CREATE STREAM ss6 AS SELECT a.area FROM readings r JOIN area_alerts a WITHIN 1 MINUTE ON r.area = UCASE(a.area);
CREATE STREAM ss7 AS SELECT a.level FROM readings r JOIN area_alerts a WITHIN 1 MINUTE ON r.reading = a.level;
CREATE STREAM ss8 AS SELECT r.sensor FROM readings r JOIN area_alerts a WITHIN 1 MINUTE ON r.reading = a.area;
CREATE STREAM ss9 AS SELECT r.sensor FROM readings r JOIN area_alerts a WITHIN 1 MINUTE ON r.ROWTIME = a.level;
CREATE STREAM int_keyed (id INT KEY, v INT) WITH (kafka_topic='int_keyed', partitions=4, value_format='json');
CREATE STREAM ss10 AS SELECT a.level FROM int_keyed i JOIN area_alerts a WITHIN 1 MINUTE ON i.id + 1 = a.level;
CREATE STREAM ss11 AS SELECT a.level, i.v FROM int_keyed i JOIN area_alerts a WITHIN 1 MINUTE ON i.id = a.level;
CREATE STREAM j30 AS SELECT i.v FROM int_keyed i JOIN sensors s ON CAST(i.id AS VARCHAR) = s.id;
CREATE STREAM ss6 AS SELECT c.userid FROM clicks c JOIN alerts a WITHIN 10 SECONDS ON c.userid = a.sensor;

-- INSERT ... VALUES: serialized per the declared formats, partitioned as the Java client does.
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-1', 'wheel', 20);
INSERT INTO readings VALUES ('sensor-2', 'motor', -3, 1700000000000);
INSERT INTO clicks (userid, pageid, referrer) VALUES (7, 'home', NULL);
INSERT INTO `MixedCase` ("Quoted", plain) VALUES ('k', 1);
INSERT INTO users (id, seen) VALUES ('u1', '2026-01-02T03:04:05.678+01:00');
INSERT INTO users (id, seen) VALUES ('u1', 1700000000123);
INSERT INTO users (id, seen) VALUES ('u1', '2026-1-2');
INSERT INTO readings (sensor, reading) VALUES ('sensor-3', 'not a number');
INSERT INTO readings (sensor, nope) VALUES ('sensor-3', 1);
INSERT INTO readings (area) VALUES ('no key');
INSERT INTO users (id, name, age) VALUES ('u1', 'ann', 30);
INSERT INTO avg_readings (sensor) VALUES ('x');

-- Pull and push queries: planned here, executed by the router.
SELECT * FROM avg_readings WHERE sensor = 'sensor-1';
SELECT sensor, avg_reading * 2 AS twice, ROUND(avg_reading, 1) FROM avg_readings WHERE n > 1 LIMIT 3;
SELECT * FROM hot WHERE band = 'hot' EMIT CHANGES LIMIT 10;
SELECT name, address->zip, CAST(age AS VARCHAR) AS age_text, COALESCE(score, 0.0) AS score FROM users WHERE name LIKE 'A%';
SELECT nope FROM avg_readings;
SELECT sensor FROM avg_readings WHERE avg_reading = 'high';
SELECT sensor, COUNT(*) FROM avg_readings;

-- Session properties.
SET 'auto.offset.reset'='earliest';
SET 'auto.offset.reset'='sometimes';
SET 'no.such.property'='1';
UNSET 'auto.offset.reset';

-- Views of the metastore.
SHOW STREAMS;
LIST TABLES;
SHOW QUERIES;
SHOW PROPERTIES;
DESCRIBE readings;
DESCRIBE EXTENDED avg_readings;
DESCRIBE nowhere;
EXPLAIN CTAS_AVG_READINGS_1;
EXPLAIN CST_USERS_0;
EXPLAIN CSAS_BY_USER_4;
EXPLAIN SELECT sensor FROM avg_readings WHERE sensor = 'x';
EXPLAIN CREATE STREAM planned AS SELECT sensor, reading FROM readings WHERE reading > 10;
EXPLAIN NO_SUCH_QUERY;

-- Dropping and terminating.
DROP STREAM readings;
DROP TABLE readings;
DROP STREAM IF EXISTS nothing_here;
DROP STREAM nothing_here;
TERMINATE INSERTQUERY_7;
TERMINATE NO_SUCH_QUERY;
DROP STREAM hot_copy DELETE TOPIC;
DROP TABLE by_area DELETE TOPIC;
TERMINATE ALL;
SHOW QUERIES;
DROP STREAM hot;
DROP STREAM readings;
SHOW STREAMS;

-- GROUP BY several expressions: a key of several columns, KEY_FORMAT JSON (as ksqlDB's).
CREATE STREAM visits (userid VARCHAR KEY, page VARCHAR, region VARCHAR, ms INT, score DOUBLE, ok BOOLEAN)
  WITH (kafka_topic='visits', partitions=3, value_format='json');
CREATE TABLE per_page AS SELECT page, region, COUNT(*) AS n, SUM(ms) AS total FROM visits GROUP BY page, region;
CREATE TABLE per_page_case WITH (key_format='json') AS SELECT UCASE(region) AS area, page, MAX(ms) AS top FROM visits
  WHERE ms > 0 GROUP BY page, UCASE(region) HAVING MAX(ms) > 10;
CREATE TABLE per_user_window AS SELECT userid, page, COUNT(*) AS n FROM visits WINDOW TUMBLING (SIZE 1 MINUTE)
  GROUP BY userid, page;
DESCRIBE per_page;
DESCRIBE EXTENDED per_page_case;
EXPLAIN CREATE TABLE per_page_explained AS SELECT page, region, COUNT(*) AS n FROM visits GROUP BY page, region;
SELECT * FROM per_page WHERE page = '/home' AND region = 'eu';
SELECT page, n FROM per_page WHERE page = '/home';
SELECT * FROM per_user_window WHERE userid = 'u1' AND page = '/a' AND WINDOWSTART >= 0;
SELECT * FROM per_page EMIT CHANGES;
CREATE TABLE pp1 WITH (key_format='kafka') AS SELECT page, region, COUNT(*) FROM visits GROUP BY page, region;
CREATE TABLE pp2 WITH (key_format='json') AS SELECT page, COUNT(*) FROM visits GROUP BY page;
CREATE TABLE pp3 AS SELECT page, COUNT(*) FROM visits GROUP BY page, region;
CREATE TABLE pp4 AS SELECT page, region, page AS p2, COUNT(*) FROM visits GROUP BY page, region;
CREATE TABLE pp5 AS SELECT page, region, COUNT(*) FROM visits GROUP BY page, region, page;
CREATE TABLE pp6 AS SELECT page, ok, COUNT(*) FROM visits GROUP BY page, ok;
CREATE TABLE pp7 AS SELECT page, region, ms, COUNT(*) FROM visits GROUP BY page, region;
CREATE TABLE pp8 AS SELECT page, score, COUNT(*) AS n FROM visits GROUP BY page, score;
CREATE TABLE pp9 AS SELECT page, MAX(n) AS n FROM per_page GROUP BY page;
CREATE TABLE pp11 AS SELECT p.page, p.n, q.top FROM per_page p JOIN per_page_case q ON p.page = q.page;
CREATE STREAM jsonkey (k VARCHAR KEY, v INT) WITH (kafka_topic='jsonkey', value_format='json', key_format='json');
CREATE STREAM twokeys (a VARCHAR KEY, b INT KEY, v INT) WITH (kafka_topic='twokeys', value_format='json');
CREATE TABLE twokeyed (a VARCHAR PRIMARY KEY, b INT PRIMARY KEY, v INT) WITH (kafka_topic='twokeyed', value_format='json', key_format='json');
CREATE STREAM kafkakeys (a VARCHAR KEY, b INT KEY, v INT) WITH (kafka_topic='kafkakeys', value_format='json', key_format='kafka');
CREATE STREAM boolkeys (a VARCHAR KEY, b BOOLEAN KEY, v INT) WITH (kafka_topic='boolkeys', value_format='json');
DESCRIBE EXTENDED twokeys;
CREATE STREAM tk1 AS SELECT a, b, v * 2 AS v2 FROM twokeys WHERE b > 0;
CREATE STREAM tk2 AS SELECT b, a, v FROM twokeys;
CREATE STREAM tk3 AS SELECT v, a FROM twokeys PARTITION BY v;
CREATE STREAM tk4 AS SELECT a, v FROM twokeys;
CREATE TABLE tk5 AS SELECT a, COUNT(*) AS n FROM twokeys GROUP BY a;
CREATE TABLE tk6 AS SELECT a, b, v FROM twokeyed WHERE v > 1;
CREATE TABLE tk7 AS SELECT b, a, v FROM twokeyed;
CREATE STREAM tk8 AS SELECT t.a, t.b, k.v FROM twokeys t JOIN twokeyed k ON t.a = k.a;
EXPLAIN CREATE STREAM tk9 AS SELECT b, a, v FROM twokeys;
SELECT * FROM twokeyed WHERE a = 'x' AND b = 1;
INSERT INTO twokeys (a, b, v) VALUES ('x', 1, 2);
INSERT INTO twokeys (a, v) VALUES ('x', 2);
TERMINATE CTAS_PER_PAGE_40;
INSERT INTO per_page (page, region, n, total) VALUES ('/ünï', 'EU', 1, 2);
INSERT INTO per_page (page, n, total) VALUES ('/a', 1, 2);

-- GROUP BY over a stream-table join: the joined rows keyed by the GROUP BY, then aggregated.
CREATE TABLE pages (page VARCHAR PRIMARY KEY, owner VARCHAR, weight INT) WITH (kafka_topic='pages', partitions=3, value_format='json');
CREATE TABLE per_owner AS SELECT p.owner, COUNT(*) AS n, SUM(v.ms * p.weight) AS cost FROM visits v JOIN pages p ON v.page = p.page
  WHERE v.ms > 0 GROUP BY p.owner HAVING COUNT(*) > 1;
EXPLAIN CTAS_PER_OWNER_51;
DESCRIBE per_owner;
EXPLAIN CREATE TABLE per_owner_minute AS SELECT owner, region, COUNT(*) FROM visits v LEFT JOIN pages p ON v.page = p.page
  WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY owner, region;
CREATE STREAM per_owner_s AS SELECT p.owner, COUNT(*) AS n FROM visits v JOIN pages p ON v.page = p.page GROUP BY p.owner;
CREATE TABLE per_owner_2 AS SELECT p.owner, COUNT(*) AS n FROM visits v JOIN pages p ON v.page = p.page GROUP BY p.owner PARTITION BY p.owner;
CREATE TABLE per_owner_3 AS SELECT owner, ms, COUNT(*) AS n FROM visits v JOIN pages p ON v.page = p.page GROUP BY owner;
CREATE TABLE per_owner_4 AS SELECT nope, COUNT(*) AS n FROM visits v JOIN pages p ON v.page = p.page GROUP BY nope;
CREATE TABLE per_owner_5 AS SELECT p.owner, COUNT(*) AS n FROM pages p JOIN pages q ON p.page = q.page GROUP BY p.owner;
EXPLAIN CREATE STREAM tk10 AS SELECT a AS aa, b, v FROM twokeys;
CREATE TABLE tk11 AS SELECT a AS aa, b, v FROM twokeyed;
CREATE OR REPLACE TABLE per_owner AS SELECT UCASE(p.owner) AS owner, COUNT(*) AS n, SUM(v.ms * p.weight) AS cost FROM visits v
  JOIN pages p ON v.page = p.page WHERE v.ms > 0 GROUP BY UCASE(p.owner) HAVING COUNT(*) > 1;
CREATE OR REPLACE TABLE per_owner AS SELECT page AS owner, COUNT(*) AS n, SUM(ms) AS cost FROM visits GROUP BY page HAVING COUNT(*) > 1;

-- Multi-way stream-table joins on different expressions: a stage per expression, the joined rows re-keyed between.
CREATE TABLE owners (name VARCHAR PRIMARY KEY, team VARCHAR) WITH (kafka_topic='owners', partitions=3, value_format='json');
CREATE TABLE teams (id VARCHAR PRIMARY KEY, boss VARCHAR) WITH (kafka_topic='teams', partitions=3, value_format='json');
CREATE STREAM chained AS SELECT t.id AS team, v.userid, p.owner, o.team AS owner_team, t.boss FROM visits v
  JOIN pages p ON v.page = p.page LEFT JOIN owners o ON p.owner = o.name JOIN teams t ON UCASE(o.team) = t.id WHERE v.ms > 0;
DESCRIBE chained;
EXPLAIN CREATE STREAM chained_1 AS SELECT v.page, p.owner, o.team FROM visits v JOIN pages p ON v.page = p.page
  JOIN owners o ON v.region = o.name;
CREATE STREAM chained_2 AS SELECT v.page, p.owner FROM visits v JOIN pages p ON v.page = p.page JOIN owners o ON p.owner = o.name;
CREATE STREAM chained_3 AS SELECT p.owner, v.page FROM visits v JOIN pages p ON v.page = p.page JOIN owners o ON o.team = o.name;
CREATE STREAM chained_4 AS SELECT p.owner, v.page FROM visits v JOIN owners o ON p.owner = o.name JOIN pages p ON v.page = p.page;
CREATE STREAM chained_5 AS SELECT p.owner, v.page FROM visits v JOIN pages p ON v.page = p.page JOIN sites s ON p.owner = s.id;
CREATE TABLE per_team AS SELECT o.team, COUNT(*) AS n, SUM(v.ms) AS ms FROM visits v JOIN pages p ON v.page = p.page
  JOIN owners o ON p.owner = o.name GROUP BY o.team;
DESCRIBE per_team;
CREATE TABLE per_team_latest AS SELECT o.team, MAX(v.ROWTIME) AS latest FROM visits v JOIN pages p ON v.page = p.page
  JOIN owners o ON p.owner = o.name GROUP BY o.team;
CREATE TABLE per_team_2 AS SELECT o.team, COUNT(*) AS n FROM visits v JOIN pages p ON v.page = p.page
  JOIN owners o ON p.owner = o.name GROUP BY o.team HAVING v.ms > 1;
-- A stream-stream join first, then a table on another expression: a stage each.
CREATE STREAM views3 (userid VARCHAR KEY, page VARCHAR, ms INT) WITH (kafka_topic='views3', partitions=3, value_format='json');
CREATE STREAM seen_pages AS SELECT p.page, v.userid, w.ms AS view_ms, p.owner FROM visits v JOIN views3 w
  WITHIN 1 MINUTE ON v.userid = w.userid LEFT JOIN pages p ON v.page = p.page;
DESCRIBE seen_pages;
CREATE STREAM seen_pages_2 AS SELECT v.page, w.ms FROM visits v JOIN pages p ON v.page = p.page
  JOIN views3 w WITHIN 1 MINUTE ON v.userid = w.userid;
-- GROUP BY over a stream-stream join: both streams gathered, the joined pairs keyed by the GROUP BY, then aggregated.
CREATE TABLE per_view_page AS SELECT w.page, COUNT(*) AS n, SUM(w.ms) AS ms FROM visits v JOIN views3 w
  WITHIN 1 MINUTE ON v.userid = w.userid GROUP BY w.page;
DESCRIBE per_view_page;
EXPLAIN CREATE TABLE per_view_page_2 AS SELECT w.page, COUNT(*) AS n FROM visits v LEFT JOIN views3 w
  WITHIN 1 MINUTE ON v.page = w.page WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY w.page;
EXPLAIN CREATE TABLE per_view_page_3 AS SELECT p.owner, COUNT(*) AS n FROM visits v JOIN views3 w
  WITHIN 1 MINUTE ON v.userid = w.userid JOIN pages p ON v.page = p.page GROUP BY p.owner;
-- GROUP BY over a table: each changed row taken out of its old group and put into its new one.
EXPLAIN CREATE TABLE owner_weights AS SELECT owner, COUNT(*) AS pages, SUM(weight) AS weight, AVG(weight) AS mean
  FROM pages WHERE weight > 0 GROUP BY owner HAVING COUNT(*) > 0;
CREATE TABLE owner_weights AS SELECT owner, COUNT(*) AS pages, SUM(weight) AS weight, AVG(weight) AS mean
  FROM pages WHERE weight > 0 GROUP BY owner HAVING COUNT(*) > 0;
DESCRIBE owner_weights;
EXPLAIN CREATE TABLE page_rows WITH (partitions=2) AS SELECT page, COUNT(owner) AS owned FROM pages GROUP BY page;
CREATE TABLE per_page_region AS SELECT region, COUNT(*) AS pages, SUM(n) AS n FROM per_page GROUP BY region;
CREATE TABLE owner_top AS SELECT owner, MAX(weight) AS top FROM pages GROUP BY owner;
CREATE TABLE owner_list AS SELECT owner, COLLECT_LIST(page) AS pages FROM pages GROUP BY owner;
CREATE TABLE owner_minute AS SELECT owner, COUNT(*) AS n FROM pages WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY owner;
CREATE TABLE owner_only AS SELECT owner FROM pages GROUP BY owner;
CREATE STREAM owner_stream AS SELECT owner, COUNT(*) AS n FROM pages GROUP BY owner;
-- GROUP BY over tables joined with tables: the joined rows regrouped as a table's.
CREATE TABLE owner_teams AS SELECT o.team, COUNT(*) AS pages, SUM(p.weight) AS weight FROM pages p
  LEFT JOIN owners o ON p.owner = o.name WHERE p.weight > 0 GROUP BY o.team;
EXPLAIN CTAS_OWNER_TEAMS_63;
DESCRIBE owner_teams;
CREATE TABLE per_owner_pages AS SELECT p.page, COUNT(*) AS n FROM pages p JOIN pages q ON p.page = q.page GROUP BY p.page;
EXPLAIN CREATE TABLE owner_boss AS SELECT o.team, t.boss, COUNT(*) AS n FROM owners o JOIN teams t ON o.team = t.id
  GROUP BY o.team, t.boss;
CREATE TABLE owner_top_2 AS SELECT o.team, MAX(p.weight) AS top FROM pages p JOIN owners o ON p.owner = o.name
  GROUP BY o.team;
CREATE OR REPLACE TABLE owner_weights AS SELECT owner, COUNT(*) AS pages, SUM(weight) AS weight, AVG(weight) AS mean
  FROM pages WHERE weight > 10 GROUP BY owner HAVING COUNT(*) > 0;
CREATE TABLE signed (id VARCHAR PRIMARY KEY, _sign INT) WITH (kafka_topic='signed', partitions=1, value_format='json');
CREATE TABLE signed_counts AS SELECT _sign, COUNT(*) AS n FROM signed GROUP BY _sign;
CREATE TABLE owner_minute_2 AS SELECT o.team, COUNT(*) AS n FROM pages p JOIN owners o ON p.owner = o.name
  WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY o.team;
EXPLAIN CREATE TABLE team_bosses AS SELECT t.boss, COUNT(o.name) AS owners FROM owners o FULL OUTER JOIN teams t
  ON o.name = t.id GROUP BY t.boss;
-- Tables joined on different keys: a stage per foreign key, the rows joined so far keyed by the first table's key.
CREATE TABLE page_bosses AS SELECT p.page, p.weight, o.team, t.boss FROM pages p LEFT JOIN owners o ON p.owner = o.name
  LEFT JOIN teams t ON o.team = t.id WHERE p.weight > 0;
EXPLAIN CTAS_PAGE_BOSSES_65;
DESCRIBE page_bosses;
EXPLAIN CREATE TABLE boss_weights AS SELECT t.boss, COUNT(*) AS n, SUM(p.weight) AS w FROM pages p
  JOIN owners o ON p.owner = o.name JOIN teams t ON o.team = t.id GROUP BY t.boss;
CREATE TABLE page_bosses_2 AS SELECT p.page, t.boss FROM pages p JOIN owners o ON p.owner = o.name
  FULL OUTER JOIN teams t ON o.team = t.id;
CREATE TABLE page_bosses_3 AS SELECT o.team, t.boss FROM pages p JOIN owners o ON p.owner = o.name
  JOIN teams t ON o.team = t.id;
CREATE TABLE page_meta (page VARCHAR PRIMARY KEY, tag VARCHAR) WITH (kafka_topic='page_meta', partitions=3, value_format='json');
CREATE TABLE page_meta_2 (page VARCHAR PRIMARY KEY, tag VARCHAR) WITH (kafka_topic='page_meta_2', partitions=3, value_format='json');
EXPLAIN CREATE TABLE pm AS SELECT p.page, m.tag, n.tag AS tag2 FROM pages p JOIN page_meta m ON p.page = m.page
  JOIN page_meta_2 n ON m.page = n.page;
CREATE TABLE pm2 AS SELECT p.page, m.tag, n.tag AS tag2 FROM pages p LEFT JOIN page_meta m ON p.page = m.page
  JOIN page_meta_2 n ON m.page = n.page;
-- Aggregates whose state Millpond cannot keep or order: refused with the type; COLLECT_LIST over a table.
CREATE STREAM blobs (id VARCHAR KEY, data BYTES, attrs MAP<VARCHAR, INT>, address STRUCT<city VARCHAR, zip INT>)
  WITH (kafka_topic='blobs', partitions=1, value_format='json');
CREATE TABLE blob_min AS SELECT id, MIN(address) AS m FROM blobs GROUP BY id;
CREATE TABLE blob_latest AS SELECT id, LATEST_BY_OFFSET(data) AS d FROM blobs GROUP BY id;
CREATE TABLE blob_distinct AS SELECT id, COUNT_DISTINCT(attrs) AS n FROM blobs GROUP BY id;
CREATE TABLE blob_maps AS SELECT id, COLLECT_LIST(attrs) AS l FROM blobs GROUP BY id;
CREATE TABLE blob_list AS SELECT id, COLLECT_LIST(address) AS l, LATEST_BY_OFFSET(attrs) AS a FROM blobs GROUP BY id;
CREATE TABLE user_avatars AS SELECT name, COLLECT_LIST(avatar) AS avatars FROM users GROUP BY name;
CREATE TABLE user_places AS SELECT name, COLLECT_LIST(address) AS places FROM users GROUP BY name;
-- A stream joined after another JOIN (ksqlDB's n-way joins): a stream-stream stage of its own, after tables or a stream.
CREATE STREAM views4 (viewer VARCHAR KEY, page VARCHAR, ms INT) WITH (kafka_topic='views4', partitions=3, value_format='json');
EXPLAIN CREATE STREAM seen_pages_3 AS SELECT v.userid, v.page, p.owner, w.ms FROM visits v JOIN pages p ON v.page = p.page
  JOIN views3 w WITHIN 1 MINUTE ON v.userid = w.userid;
CREATE STREAM seen_pages_3 AS SELECT v.userid, v.page, p.owner, w.ms FROM visits v JOIN pages p ON v.page = p.page
  JOIN views3 w WITHIN 1 MINUTE ON v.userid = w.userid;
DESCRIBE seen_pages_3;
EXPLAIN CREATE STREAM three_views AS SELECT v.page, v.ms, w.ms AS ms_3, x.ms AS ms_4 FROM visits v
  LEFT JOIN views3 w WITHIN 1 MINUTE ON v.userid = w.userid FULL OUTER JOIN views4 x WITHIN (1 SECOND, 2 MINUTES)
  GRACE PERIOD 10 SECONDS ON v.page = x.page;
CREATE STREAM three_views_2 AS SELECT v.userid, w.ms FROM visits v JOIN views3 w WITHIN 1 MINUTE ON v.userid = w.userid
  JOIN views4 x ON v.userid = x.viewer;
CREATE TABLE three_views_3 AS SELECT v.userid, COUNT(*) AS n FROM visits v JOIN views3 w WITHIN 1 MINUTE
  ON v.userid = w.userid JOIN views4 x WITHIN 1 MINUTE ON v.userid = x.viewer GROUP BY v.userid;
CREATE STREAM three_views_4 AS SELECT v.userid, w.ms FROM visits v JOIN views3 w WITHIN 1 MINUTE ON v.userid = w.userid
  JOIN views3 x WITHIN 1 MINUTE ON v.userid = x.userid;
-- LATEST_BY_OFFSET and EARLIEST_BY_OFFSET as ksqlDB's: NULLs skipped unless told, N values as an ARRAY, literals checked.
EXPLAIN CREATE TABLE blob_recent AS SELECT id, LATEST_BY_OFFSET(data, false) AS d, LATEST_BY_OFFSET(attrs, 3) AS a3,
  EARLIEST_BY_OFFSET(address, 2, false) AS first2 FROM blobs GROUP BY id;
CREATE TABLE blob_recent AS SELECT id, LATEST_BY_OFFSET(data, false) AS d, LATEST_BY_OFFSET(attrs, 3) AS a3,
  EARLIEST_BY_OFFSET(address, 2, false) AS first2 FROM blobs GROUP BY id;
DESCRIBE blob_recent;
CREATE TABLE blob_recent_0 AS SELECT id, LATEST_BY_OFFSET(data, 0) AS d FROM blobs GROUP BY id;
CREATE TABLE blob_recent_1 AS SELECT id, EARLIEST_BY_OFFSET(data, id) AS d FROM blobs GROUP BY id;
CREATE TABLE blob_recent_2 AS SELECT id, LATEST_BY_OFFSET(data, true, 2) AS d FROM blobs GROUP BY id;
CREATE TABLE blob_recent_3 AS SELECT id, COLLECT_LIST(data, 2) AS d FROM blobs GROUP BY id;
CREATE TABLE blob_recent_4 AS SELECT id, LATEST_BY_OFFSET(data, 2, false, true) AS d FROM blobs GROUP BY id;
-- GROUP BY over a stream's n-way join: the last JOIN's stage keys each joined row by the GROUP BY.
EXPLAIN CREATE TABLE three_views_5 AS SELECT v.userid, COUNT(*) AS n, MAX(x.ms) AS longest FROM visits v
  JOIN views3 w WITHIN 1 MINUTE ON v.userid = w.userid JOIN views4 x WITHIN 1 MINUTE ON v.userid = x.viewer
  GROUP BY v.userid;
EXPLAIN CREATE TABLE owners_seen AS SELECT p.owner, COUNT(*) AS n FROM visits v JOIN pages p ON v.page = p.page
  JOIN views3 w WITHIN 1 MINUTE ON v.userid = w.userid WINDOW TUMBLING (SIZE 1 HOUR) GROUP BY p.owner;
CREATE TABLE owners_seen AS SELECT p.owner, COUNT(*) AS n FROM visits v JOIN pages p ON v.page = p.page
  JOIN views3 w WITHIN 1 MINUTE ON v.userid = w.userid WINDOW TUMBLING (SIZE 1 HOUR) GROUP BY p.owner;
CREATE TABLE blob_recent_5 AS SELECT id, EARLIEST_BY_OFFSET() AS d FROM blobs GROUP BY id;
CREATE TABLE pages_seen AS SELECT p.owner, COUNT(*) AS n FROM pages p JOIN page_meta m ON p.page = m.page
  JOIN visits v WITHIN 1 MINUTE ON p.page = v.page GROUP BY p.owner;
-- COLLECT_SET as ksqlDB's: distinct values in the order they first came; streams only.
CREATE TABLE blob_sets AS SELECT id, COLLECT_SET(address) AS places, COLLECT_SET(data) AS blobs FROM blobs GROUP BY id;
CREATE TABLE blob_sets_2 AS SELECT id, COLLECT_SET(attrs) AS a FROM blobs GROUP BY id;
CREATE TABLE user_sets AS SELECT name, COLLECT_SET(avatar) AS avatars FROM users GROUP BY name;
-- TOPK and TOPKDISTINCT as ksqlDB's: the k greatest values, descending; streams only.
EXPLAIN CREATE TABLE top_views AS SELECT viewer, TOPK(ms, 3) AS top3, TOPKDISTINCT(page, 2) AS pages
  FROM views4 GROUP BY viewer;
CREATE TABLE top_views AS SELECT viewer, TOPK(ms, 3) AS top3, TOPKDISTINCT(page, 2) AS pages FROM views4 GROUP BY viewer;
DESCRIBE top_views;
CREATE TABLE top_views_0 AS SELECT viewer, TOPK(ms) AS top FROM views4 GROUP BY viewer;
CREATE TABLE top_views_1 AS SELECT viewer, TOPKDISTINCT(ms, 0) AS top FROM views4 GROUP BY viewer;
CREATE TABLE top_blobs AS SELECT id, TOPK(address, 2) AS top FROM blobs GROUP BY id;
-- HISTOGRAM as ksqlDB's: each VARCHAR value's count, over streams and tables.
CREATE TABLE view_pages AS SELECT viewer, HISTOGRAM(page) AS pages FROM views4 GROUP BY viewer;
DESCRIBE view_pages;
CREATE TABLE view_pages_2 AS SELECT viewer, HISTOGRAM(ms) AS pages FROM views4 GROUP BY viewer;
CREATE TABLE user_names AS SELECT name, HISTOGRAM(name) AS names, COUNT(*) AS n FROM users GROUP BY name;
-- STDDEV_SAMP: the sample standard deviation (ksqlDB's, as fixed in its issue 8345), over streams and tables.
CREATE TABLE view_spread AS SELECT viewer, STDDEV_SAMP(ms) AS spread FROM views4 GROUP BY viewer;
CREATE TABLE view_spread_2 AS SELECT viewer, STDDEV_SAMP(page) AS spread FROM views4 GROUP BY viewer;
-- GREATEST and LEAST order their arguments: a MAP, STRUCT or ARRAY is refused (it crashed a push stream).
SELECT id, GREATEST(age, 3), LEAST(name, 'm') FROM users WHERE id = 'u1';
SELECT id, GREATEST(attrs, attrs) FROM users WHERE id = 'u1';
SELECT id, LEAST(address, address) FROM users WHERE id = 'u1';

-- Expressions over aggregates, created last (the query ids above stay as they were).
CREATE STREAM gauges (sensor VARCHAR KEY, reading INT) WITH (kafka_topic='gauges', partitions=2, value_format='json');
CREATE TABLE means AS SELECT sensor, COUNT(*) AS n, SUM(reading) / COUNT(*) AS mean, ROUND(AVG(reading), 2) AS avg2
  FROM gauges GROUP BY sensor;
DESCRIBE means;
CREATE TABLE w_means AS SELECT sensor, COUNT(*) * 2 AS windowstart FROM gauges WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY sensor;

-- ksqlDB's time functions: patterns and zones written as they are, refused where Python would not write or read as Spark.
EXPLAIN CREATE STREAM gauge_times AS SELECT sensor, TIMESTAMPTOSTRING(ROWTIME, 'yyyy-MM-dd HH:mm', 'Europe/Paris') AS at,
  FROM_UNIXTIME(ROWTIME) AS ts, STRINGTOTIMESTAMP('2024-01-02', 'yyyy-MM-dd') AS day FROM gauges;
CREATE STREAM gauge_times AS SELECT sensor, TIMESTAMPTOSTRING(ROWTIME, 'yyyy-MM-dd HH:mm', 'Europe/Paris') AS at,
  FROM_UNIXTIME(ROWTIME) AS ts, PARSE_TIMESTAMP('2024-01-02', 'yyyy-MM-dd') AS day FROM gauges;
DESCRIBE gauge_times;
CREATE STREAM gauge_times_2 AS SELECT sensor, TIMESTAMPTOSTRING(ROWTIME, 'YYYY-ww') AS week FROM gauges;
CREATE STREAM gauge_times_3 AS SELECT sensor, TIMESTAMPTOSTRING(ROWTIME, 'HH:mm', 'Mars/Olympus') AS at FROM gauges;
CREATE STREAM gauge_times_4 AS SELECT sensor, FORMAT_TIMESTAMP(ROWTIME, 'HH:mm') AS at FROM gauges;
-- ksqlDB's REGEXP functions over Java's patterns, refused where Python would not read them as Java.
EXPLAIN CREATE STREAM gauge_codes AS SELECT sensor, REGEXP_EXTRACT('([a-z]+)-(?<n>[0-9]+)', sensor, 2) AS n,
  REGEXP_REPLACE(sensor, '(?<n>[0-9]+)', '#${n}') AS tagged, REGEXP_SPLIT_TO_ARRAY(sensor, '-') AS parts FROM gauges;
CREATE STREAM gauge_codes_2 AS SELECT sensor, REGEXP_EXTRACT('\bx', sensor) AS n FROM gauges;
CREATE STREAM gauge_codes_3 AS SELECT sensor, REGEXP_REPLACE(sensor, '(a)', '$2') AS n FROM gauges;
-- TIMESTAMPADD and DATEADD: the unit is a word (not a column), the amount moves the time by a duration.
EXPLAIN CREATE STREAM gauge_later AS SELECT sensor, TIMESTAMPADD(MINUTES, reading, FROM_UNIXTIME(ROWTIME)) AS later,
  DATESUB(DAYS, 1, FROM_DAYS(reading)) AS before FROM gauges;
CREATE STREAM gauge_later_2 AS SELECT sensor, TIMESTAMPADD(WEEKS, 1, FROM_UNIXTIME(ROWTIME)) AS later FROM gauges;
-- LIKE in linear time: a simple pattern stays Spark's LIKE, any other is one Java regex of atomic groups (a pattern
-- column's made row by row, NULL where Spark could not read it); a pattern written as text Spark could not read is refused.
EXPLAIN CREATE STREAM gauge_likes AS SELECT sensor, sensor LIKE 'g%' AS g, sensor LIKE '%a%b_%' AS ab,
  sensor LIKE CAST(reading AS VARCHAR) AS by_column FROM gauges;
CREATE STREAM gauge_likes_2 AS SELECT sensor FROM gauges WHERE sensor LIKE 'a\x%';
-- A windowed table's WINDOWSTART and WINDOWEND are its own: no other column of it takes their names.
CREATE TABLE w_counts AS SELECT sensor, COUNT(*) AS windowstart FROM gauges WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY sensor;
CREATE TABLE w_keys AS SELECT sensor AS windowend, COUNT(*) AS n FROM gauges WINDOW HOPPING (SIZE 2 MINUTES, ADVANCE BY 1 MINUTE) GROUP BY sensor;
-- ksqlDB's lambda functions: TRANSFORM, FILTER and REDUCE over ARRAYs and MAPs, Spark's higher-order functions;
-- REDUCE's state takes the type its lambda gives; TRANSFORM of a MAP takes two lambdas, and keys of a few types.
EXPLAIN CREATE TABLE user_lambdas AS SELECT id, TRANSFORM(tags, t => UCASE(t)) AS upper_tags,
  FILTER(attrs, (k, v) => v > age) AS above, REDUCE(attrs, 0, (s, k, v) => s + v * balance) AS weighted FROM users;
SELECT id, TRANSFORM(tags, t => CONCAT(t, '!')) AS loud, REDUCE(tags, '', (s, t) => s || t) AS joined FROM users WHERE id = 'u1';
CREATE TABLE user_lambdas_2 AS SELECT id, TRANSFORM(attrs, (k, v) => v) AS vs FROM users;
EXPLAIN CREATE TABLE user_lambdas_4 AS SELECT id, TRANSFORM(attrs, (k, v) => UCASE(k), (k, v) => v + age) AS shouted FROM users;
CREATE TABLE user_lambdas_5 AS SELECT id, TRANSFORM(attrs, (k, v) => tags, (k, v) => v) AS by_tags FROM users;
CREATE TABLE user_lambdas_3 AS SELECT id, UCASE(t => t) AS nope FROM users;
-- UNIX_TIMESTAMP() and UNIX_DATE() without an argument: now (a persistent query's micro-batch's time).
EXPLAIN CREATE STREAM gauge_now AS SELECT sensor, UNIX_TIMESTAMP() - ROWTIME AS age_ms, UNIX_DATE() AS today FROM gauges;
-- ENTRIES, AS_MAP and GENERATE_SERIES: NULL where ksqlDB fails the record (a step of 0 or away from the end) and Spark the batch.
EXPLAIN CREATE TABLE user_entries AS SELECT id, ENTRIES(attrs, true) AS sorted, AS_MAP(tags, GENERATE_SERIES(1, age)) AS ranked, GENERATE_SERIES(age, 0, -2) AS down FROM users;
CREATE TABLE user_entries_2 AS SELECT id, AS_MAP(GENERATE_SERIES(1, 3), GENERATE_SERIES(age, 0)) AS by_number, GENERATE_SERIES(1.5, 3) AS nope FROM users;
-- SHOW FUNCTIONS: every function, its type and how a call is written.
SHOW FUNCTIONS;
-- \b and \p{..} in REGEXP patterns, read as Java 17 reads them; a block's class is refused.
EXPLAIN CREATE STREAM gauge_words AS SELECT sensor, REGEXP_EXTRACT_ALL('\b\p{L}+\b', sensor) AS words, REGEXP_REPLACE(sensor, '[^\p{Alnum}]', '') AS kept, REGEXP_EXTRACT('\p{IsLatin}+', sensor) AS latin FROM gauges;
CREATE STREAM gauge_words_2 AS SELECT sensor, REGEXP_EXTRACT('\p{InGreek}+', sensor) AS greek FROM gauges;
-- ksqlDB's custom types: a statement naming one has it written out as it is then, so a stream keeps its columns when
-- the type is dropped; a type may name another; SHOW TYPES lists them.
CREATE TYPE address AS STRUCT<number INT, street VARCHAR, city VARCHAR>;
CREATE TYPE IF NOT EXISTS address AS INT;
CREATE TYPE address AS INT;
CREATE TYPE `INT` AS BIGINT;
CREATE TYPE person AS STRUCT<name VARCHAR, home ADDRESS, past ARRAY<address>>;
CREATE STREAM people (id VARCHAR KEY, who PERSON, homes MAP<VARCHAR, address>) WITH (kafka_topic='people', partitions=1, value_format='json');
CREATE STREAM nobody (id VARCHAR KEY, who NO_SUCH_TYPE) WITH (kafka_topic='nobody', partitions=1, value_format='json');
CREATE TYPE cents AS DECIMAL(12, 2);
EXPLAIN CREATE STREAM people_cities AS SELECT id, who->home->city AS city, CAST(ARRAY_LENGTH(who->past) AS cents) AS moves FROM people;
CREATE STREAM people_cities AS SELECT id, who->home->city AS city, CAST(ARRAY_LENGTH(who->past) AS cents) AS moves FROM people;
CREATE STREAM payments (id VARCHAR KEY, amount CENTS, tags ARRAY<cents>) WITH (kafka_topic='payments', partitions=1, value_format='json');
INSERT INTO payments (id, amount) VALUES ('p1', CAST(12.345 AS cents));
INSERT INTO payments (id, amount) VALUES ('p1', CAST(12.345 AS dollars));
SHOW TYPES;
DROP TYPE address;
DROP TYPE address;
DROP TYPE IF EXISTS address;
DESCRIBE people;
DESCRIBE people_cities;
SHOW TYPES;
-- DESCRIBE FUNCTION (ksqlDB's): a function's type, how a call is written and what it does.
DESCRIBE FUNCTION round;
DESCRIBE FUNCTION latest_by_offset;
DESCRIBE FUNCTION nope;
-- ksqlDB's constructors ARRAY[...], MAP(key := value, ...) and STRUCT(name := value, ...): in queries and INSERT VALUES,
-- the items widened to one type; an empty one, NULLs alone or types that do not mix are refused.
EXPLAIN CREATE STREAM gauge_shapes AS SELECT sensor, ARRAY[reading, 2.5] AS pair, MAP(sensor := reading) AS by_sensor,
  STRUCT(r := reading, tags := ARRAY['a', sensor]) AS shape FROM gauges;
SELECT id, ARRAY[age, 1] AS ages, STRUCT(n := name, b := balance)->b AS b, MAP('age' := age)['age'] AS a FROM users WHERE id = 'u1';
INSERT INTO people (id, who, homes) VALUES ('p2', STRUCT(name := 'Ann', past := ARRAY[STRUCT(city := 'Oslo')]), MAP('now' := STRUCT(number := 7)));
INSERT INTO people (id, who) VALUES ('p3', STRUCT(name := 'Bob', age := 3));
INSERT INTO people (id, homes) VALUES ('p3', ARRAY[1]);
INSERT INTO payments (id, tags) VALUES ('p4', ARRAY[1.005, 2]);
SELECT id, ARRAY[] AS none FROM users WHERE id = 'u1';
SELECT id, MAP(balance := name) AS m FROM users WHERE id = 'u1';
-- EXPLODE (ksqlDB's table function): a row of each item, the other columns repeated, several zipped; a whole SELECT item
-- of a persistent query over a stream, nowhere else.
EXPLAIN CREATE STREAM payment_tags AS SELECT id, EXPLODE(tags) AS tag, EXPLODE(ARRAY[1, 2, 3]) AS n, amount FROM payments;
CREATE STREAM payment_tags AS SELECT id, EXPLODE(tags) AS tag FROM payments;
CREATE TABLE user_tags AS SELECT id, EXPLODE(tags) AS tag FROM users;
SELECT id, EXPLODE(tags) AS tag FROM users WHERE id = 'u1';
CREATE STREAM payment_tags_2 AS SELECT id, EXPLODE(tags)[1] AS tag FROM payments;
CREATE STREAM payment_tags_3 AS SELECT id, EXPLODE(amount) AS tag FROM payments;
CREATE TABLE payment_tag_counts AS SELECT id, COUNT(EXPLODE(tags)) AS n FROM payments GROUP BY id;
SELECT id, EXPLODE(tags) AS tag, amount FROM payments EMIT CHANGES;
-- ALTER (ksqlDB's): value columns added at the end of a stream or table that CREATE declared; a table's materialization
-- stores them too; a query's result, a column it has and a pseudo-column's name are refused.
ALTER STREAM payments ADD COLUMN note VARCHAR, ADD paid_at TIMESTAMP;
DESCRIBE payments;
INSERT INTO payments (id, amount, note) VALUES ('p5', 1, 'late');
CREATE TABLE wallets (id VARCHAR PRIMARY KEY, n INT) WITH (kafka_topic='wallets', partitions=1, value_format='json');
ALTER TABLE wallets ADD COLUMN nickName VARCHAR;
EXPLAIN CST_WALLETS_86;
ALTER STREAM users ADD COLUMN x INT;
ALTER STREAM payment_tags ADD COLUMN x INT;
ALTER STREAM payments ADD COLUMN amount INT;
ALTER STREAM payments ADD COLUMN rowtime BIGINT;
ALTER STREAM nowhere ADD COLUMN x INT;
-- `map`, `array` and `struct` stay column names: a constructor is the word with its bracket (so `array[1]` is one, and
-- the column is quoted to take its item); a MAP is no STRUCT's value.
CREATE STREAM shapes (id VARCHAR KEY, map MAP<VARCHAR, INT>, array ARRAY<INT>, struct STRUCT<a INT>) WITH (kafka_topic='shapes', partitions=1, value_format='json');
EXPLAIN CREATE STREAM shape_parts AS SELECT id, map['k'] AS k, array[1] AS made, `ARRAY`[1] AS first, struct->a AS a, map, MAP('x' := 1) AS m FROM shapes WHERE map IS NOT NULL;
INSERT INTO shapes (id, map, struct) VALUES ('s1', MAP('k' := 1), STRUCT(a := 2));
INSERT INTO shapes (id, map) VALUES ('s2', STRUCT(k := 1));
INSERT INTO shapes (id, struct) VALUES ('s3', MAP('A' := 1));
INSERT INTO shapes (id, struct) VALUES ('s4', STRUCT(b := 1));
EXPLAIN CREATE TABLE user_texts AS SELECT id, CONVERT_TZ(seen, 'UTC', 'Asia/Tokyo') AS seen_in_tokyo, SPLIT_TO_MAP(name, ';', '=') AS parts, CHR(age) AS c, URL_ENCODE_PARAM(name) AS q, URL_DECODE_PARAM(name) AS unq FROM users;
SELECT CONVERT_TZ(seen, 'UTC', 'PST') AS t FROM users WHERE id = 'a';
SELECT CHR(name) AS c FROM users WHERE id = 'a';
EXPLAIN CREATE TABLE user_json AS SELECT id, IS_JSON_STRING(name) AS is_json, JSON_ARRAY_LENGTH(name) AS n, JSON_KEYS(name) AS keys, TO_JSON_STRING(STRUCT(name := name, born := born, seen := seen, score := score)) AS doc FROM users;
-- CREATE SOURCE STREAM|TABLE (ksqlDB's): read-only; a SOURCE table is materialized for pulls as any declared table.
CREATE SOURCE TABLE rates (currency VARCHAR PRIMARY KEY, rate DOUBLE) WITH (kafka_topic='rates', partitions=2, value_format='json');
CREATE SOURCE STREAM trades (id VARCHAR KEY, currency VARCHAR, amount DOUBLE) WITH (kafka_topic='trades', partitions=2, value_format='json');
DESCRIBE rates;
INSERT INTO rates (currency, rate) VALUES ('EUR', 1.1);
CREATE STREAM trades_copy AS SELECT * FROM trades;
INSERT INTO trades SELECT * FROM trades_copy;
CREATE OR REPLACE SOURCE TABLE rates (currency VARCHAR PRIMARY KEY, rate DOUBLE) WITH (kafka_topic='rates', partitions=2, value_format='json');
CREATE OR REPLACE TABLE rates (currency VARCHAR PRIMARY KEY, rate DOUBLE) WITH (kafka_topic='rates', partitions=2, value_format='json');
ALTER TABLE rates ADD COLUMN source VARCHAR;
-- ROWPARTITION and ROWOFFSET (ksqlDB's): a record's partition and offset, in push queries and pulls over a stream.
SELECT id, ROWPARTITION, ROWOFFSET FROM trades WHERE ROWOFFSET >= 0 EMIT CHANGES;
SELECT id, ROWPARTITION AS p FROM trades WHERE ROWPARTITION = 1;
CREATE STREAM trade_places AS SELECT id, ROWPARTITION AS p FROM trades;
SELECT currency, ROWOFFSET FROM rates WHERE currency = 'EUR';
TERMINATE CST_RATES_87;
CREATE OR REPLACE TABLE rates AS SELECT currency, LATEST_BY_OFFSET(amount) AS rate FROM trades GROUP BY currency;
CREATE OR REPLACE SOURCE STREAM fresh_trades (id VARCHAR KEY) WITH (kafka_topic='trades', partitions=2, value_format='json');
-- JSON_ITEMS, JSON_RECORDS, JSON_CONCAT and JSON_ARRAY_CONTAINS read JSON as Spark's VARIANT; CHR of escapes; ATTR.
EXPLAIN CREATE TABLE user_variants AS SELECT id, JSON_ITEMS(name) AS items, JSON_RECORDS(name) AS records, JSON_CONCAT(name, '[1]', name) AS joined, JSON_ARRAY_CONTAINS(name, age) AS has, CHR(name) AS c FROM users;
SELECT JSON_ARRAY_CONTAINS(name, balance) AS has FROM users WHERE id = 'a';
SELECT CHR(age > 1) AS c FROM users WHERE id = 'a';
EXPLAIN CREATE TABLE currency_of_trade AS SELECT id, ATTR(currency) AS currency, COUNT(*) AS n FROM trades GROUP BY id;
EXPLAIN CREATE TABLE name_of_age AS SELECT age, ATTR(name) AS name FROM users GROUP BY age;
-- ROWPARTITION and ROWOFFSET in persistent queries over a stream (behind a repartition, the input record's); not over a table.
EXPLAIN CREATE TABLE trade_offsets AS SELECT currency, MAX(ROWOFFSET) AS last_offset, COLLECT_SET(ROWPARTITION) AS parts FROM trades WHERE ROWOFFSET >= 0 GROUP BY currency;
EXPLAIN CREATE STREAM trades_by_partition AS SELECT ROWPARTITION, id, ROWOFFSET AS o FROM trades PARTITION BY ROWPARTITION;
CREATE TABLE rate_places AS SELECT currency, ROWOFFSET AS o FROM rates;
CREATE STREAM trade_rates AS SELECT t.id, ROWOFFSET AS o FROM trades t JOIN rates r ON t.currency = r.currency;
CREATE STREAM trade_rates AS SELECT t.id, t.ROWPARTITION AS p FROM trades t JOIN rates r ON t.currency = r.currency;
EXPLAIN CREATE STREAM trades_by_partition AS SELECT ROWPARTITION AS p, id, ROWOFFSET AS o FROM trades PARTITION BY ROWPARTITION;
CREATE STREAM placed_oddly (id VARCHAR KEY, `rowoffset` INT) WITH (kafka_topic='placed_oddly', partitions=1, value_format='json');
-- CORRELATION (ksqlDB's): two numeric columns, one DOUBLE; over a stream and over a table.
EXPLAIN CREATE TABLE trade_correlation AS SELECT currency, CORRELATION(amount, ROWOFFSET) AS r FROM trades GROUP BY currency;
CREATE TABLE trade_correlation AS SELECT currency, CORRELATION(amount) AS r FROM trades GROUP BY currency;
CREATE TABLE trade_correlation AS SELECT currency, CORRELATION(amount, id) AS r FROM trades GROUP BY currency;
-- ROUND's places in a persistent query: a whole number of literals, folded as Spark folds it.
EXPLAIN CREATE STREAM rounded_trades AS SELECT id, ROUND(amount, 1 + 1) AS two, ROUND(amount, -(2 * 1)) AS hundreds FROM trades;
-- CUBE_EXPLODE (ksqlDB's table function): a row of each combination of the ARRAY's items.
EXPLAIN CREATE STREAM trade_cubes AS SELECT id, CUBE_EXPLODE(ARRAY[currency, id]) AS combo FROM trades;
SELECT id, CUBE_EXPLODE(ARRAY[amount, amount * 2]) AS combo FROM trades EMIT CHANGES;
CREATE TABLE rate_cubes AS SELECT currency, CUBE_EXPLODE(ARRAY[currency]) AS combo FROM rates;
SELECT id, CUBE_EXPLODE(amount) AS combo FROM trades EMIT CHANGES;
-- Persistent queries over a windowed table: its rows filtered and projected, window by window,
-- into a windowed table of the same windows (WINDOWSTART and WINDOWEND readable); aggregating it,
-- joining it, naming a column WINDOWSTART, or a stream result refused.
CREATE TABLE minute_peaks AS SELECT sensor, WINDOWSTART AS ws, WINDOWEND - WINDOWSTART AS span, avg_reading * 2 AS twice
  FROM per_minute WHERE n > 10 AND WINDOWSTART >= 60000;
DESCRIBE minute_peaks;
EXPLAIN SELECT * FROM minute_peaks WHERE sensor = 's1' AND WINDOWSTART >= 0;
CREATE TABLE hops_copy AS SELECT * FROM area_hops;
DESCRIBE hops_copy;
CREATE TABLE peaks_again AS SELECT sensor, WINDOWSTART FROM per_minute;
CREATE TABLE peak_counts AS SELECT sensor, COUNT(*) AS c FROM per_minute GROUP BY sensor;
CREATE TABLE peaks_keyless AS SELECT avg_reading FROM per_minute;
CREATE STREAM peak_stream AS SELECT * FROM per_minute;
-- GEO_DISTANCE (ksqlDB's quickstart): kilometres by default, miles by name; units a text literal.
CREATE STREAM rider_locations (profile_id VARCHAR KEY, latitude DOUBLE, longitude DOUBLE)
  WITH (kafka_topic='locations', value_format='json', partitions=1);
CREATE STREAM riders_near AS SELECT profile_id, GEO_DISTANCE(latitude, longitude, 37.4133, -122.1162, 'MI') AS miles
  FROM rider_locations WHERE GEO_DISTANCE(latitude, longitude, 37.4133, -122.1162) <= 5;
SELECT * FROM rider_locations WHERE GEO_DISTANCE(latitude, longitude, 37.4133, -122.1162, 'furlongs') <= 5 EMIT CHANGES;
SELECT * FROM rider_locations WHERE GEO_DISTANCE(latitude, longitude, 37.4133, -122.1162, profile_id) <= 5 EMIT CHANGES;
SELECT GEO_DISTANCE(latitude, 'north', 1, 2) FROM rider_locations EMIT CHANGES;
-- MAP_UNION (ksqlDB's): two MAPs of one type.
SELECT id, MAP_UNION(AS_MAP(ARRAY['a'], ARRAY[1]), AS_MAP(ARRAY['b'], ARRAY[2])) AS m FROM trades EMIT CHANGES;
SELECT id, MAP_UNION(AS_MAP(ARRAY['a'], ARRAY[1]), AS_MAP(ARRAY[1], ARRAY[2])) AS m FROM trades EMIT CHANGES;
-- DATETOSTRING and STRINGTODATE (ksqlDB's older date functions, over days from the epoch).
SELECT id, DATETOSTRING(19782, 'yyyy-MM-dd') AS d, STRINGTODATE('2024-02-29', 'yyyy-MM-dd') AS n FROM trades EMIT CHANGES;
SELECT id, DATETOSTRING(19782, 'yyyy-MM-dd HH:mm') AS d FROM trades EMIT CHANGES;
CREATE TABLE peaks_spread WITH (partitions=2) AS SELECT sensor, n FROM per_minute;
SELECT * FROM rider_locations WHERE GEO_DISTANCE(latitude, longitude, 1, 2, NULL) < 5 EMIT CHANGES;
-- SHOW ... EXTENDED and DESCRIBE STREAMS|TABLES (ksqlDB's): more of each.
SHOW TABLES EXTENDED;
DESCRIBE STREAMS EXTENDED;
SHOW QUERIES EXTENDED;
