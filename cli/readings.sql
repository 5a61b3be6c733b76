-- The readings example of seed 000: eight partitions, five sensors' worth of readings each.
-- The table is created after the inserts, so its query reads the stream from the start.
SET 'auto.offset.reset'='earliest';
CREATE STREAM readings (sensor VARCHAR KEY, area VARCHAR, reading INT)
  WITH (kafka_topic='readings', partitions=8, value_format='json');
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-1', 'wheel', 20);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-1', 'motor', 29);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-1', 'wheel', 23);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-1', 'engine', 28);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-1', 'engine', 21);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-2', 'motor', 64);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-2', 'motor', 62);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-2', 'wheel', 68);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-2', 'engine', 61);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-2', 'motor', 64);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-3', 'motor', 46);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-3', 'motor', 54);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-3', 'wheel', 45);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-3', 'engine', 53);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-3', 'motor', 51);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-4', 'motor', 16);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-4', 'wheel', 24);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-4', 'motor', 17);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-4', 'engine', 18);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-4', 'motor', 25);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-5', 'wheel', 90);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-5', 'wheel', 88);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-5', 'wheel', 91);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-5', 'engine', 86);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-5', 'engine', 88);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-6', 'motor', 67);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-6', 'engine', 66);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-6', 'wheel', 65);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-6', 'motor', 60);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-6', 'engine', 63);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-7', 'engine', 35);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-7', 'motor', 36);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-7', 'wheel', 30);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-7', 'motor', 31);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-7', 'wheel', 36);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-8', 'wheel', 94);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-8', 'wheel', 95);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-8', 'motor', 99);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-8', 'engine', 94);
INSERT INTO readings (sensor, area, reading) VALUES ('sensor-8', 'motor', 97);
CREATE TABLE avg_readings AS
  SELECT sensor, AVG(reading) AS avg_reading FROM readings GROUP BY sensor EMIT CHANGES;
