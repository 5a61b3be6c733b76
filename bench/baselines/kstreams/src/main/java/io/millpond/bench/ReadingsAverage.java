package io.millpond.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The readings AVG by sensor of {@code bench.aggregation}, written as a plain Kafka Streams
 * application: the baseline Millpond's aggregation is measured against.
 *
 * <p>It reads the readings topic (key: the sensor, value: JSON with {@code READING}), keeps
 * COUNT and SUM per sensor in a RocksDB store with its changelog under {@code exactly_once_v2},
 * and writes each sensor's AVG to the output topic as JSON, as ksqlDB's
 * {@code CREATE TABLE ... AS SELECT ... GROUP BY} does. Every 200 ms it prints
 * {@code {"counted": N, "keys": K}} on stdout (N: COUNT summed over the whole store), and
 * {@code {"state": S}} on every state change. SIGTERM closes it.
 *
 * <p>With WINDOW_MS, the same AVG per sensor per tumbling window of that size by record
 * timestamp, with ksqlDB's defaults (a grace of 24 hours, a retention of the larger of size
 * plus grace and one day) and its windowed keys in the output topic (the sensor, then the
 * window start): Millpond's {@code WINDOW TUMBLING (SIZE ...)}. The progress line then
 * counts over every window in the store ({@code keys}: windows).
 *
 * <pre>java -cp JARS io.millpond.bench.ReadingsAverage BOOTSTRAP TOPIC OUTPUT_TOPIC APPLICATION_ID THREADS STATE_DIR [WINDOW_MS]</pre>
 */
public final class ReadingsAverage {
    static final String STORE = "readings-avg";
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final long REPORT_EVERY_MS = 200;
    private static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(10);
    private static final Duration GRACE = Duration.ofHours(24);
    private static final Duration MIN_RETENTION = Duration.ofDays(1);

    private ReadingsAverage() {}

    /** COUNT and SUM of one sensor's readings: what AVG needs, as ksqlDB keeps it. */
    record CountSum(long count, long sum) {
        static final CountSum ZERO = new CountSum(0, 0);

        /** Sixteen bytes: the count, then the sum, big-endian. */
        static final Serde<CountSum> SERDE = Serdes.serdeFrom(
                (topic, total) -> ByteBuffer.allocate(16).putLong(total.count).putLong(total.sum).array(),
                (topic, bytes) -> {
                    if (bytes == null) {
                        return null;
                    }
                    ByteBuffer buffer = ByteBuffer.wrap(bytes);
                    return new CountSum(buffer.getLong(), buffer.getLong());
                });

        CountSum add(long reading) {
            return new CountSum(count + 1, sum + reading);
        }

        double average() {
            return (double) sum / count;
        }
    }

    /** The aggregation: no repartition, since the records are keyed by sensor already; per
     * tumbling window of {@code windowMs} when it is positive. */
    static Topology topology(String topic, String outputTopic, long windowMs) {
        StreamsBuilder builder = new StreamsBuilder();
        KGroupedStream<String, Long> sensors = builder.stream(topic, Consumed.with(Serdes.String(), Serdes.ByteArray()))
                .mapValues(ReadingsAverage::reading)
                .groupByKey(Grouped.with(Serdes.String(), Serdes.Long()));
        if (windowMs <= 0) {
            sensors.aggregate(() -> CountSum.ZERO, (sensor, reading, total) -> total.add(reading),
                            Materialized.<String, CountSum, KeyValueStore<Bytes, byte[]>>as(STORE)
                                    .withKeySerde(Serdes.String())
                                    .withValueSerde(CountSum.SERDE))
                    .toStream()
                    .mapValues(ReadingsAverage::averageJson)
                    .to(outputTopic, Produced.with(Serdes.String(), Serdes.String()));
            return builder.build();
        }
        Duration size = Duration.ofMillis(windowMs);
        Duration retention = size.plus(GRACE).compareTo(MIN_RETENTION) > 0 ? size.plus(GRACE) : MIN_RETENTION;
        sensors.windowedBy(TimeWindows.ofSizeAndGrace(size, GRACE))
                .aggregate(() -> CountSum.ZERO, (sensor, reading, total) -> total.add(reading),
                        Materialized.<String, CountSum, WindowStore<Bytes, byte[]>>as(STORE)
                                .withKeySerde(Serdes.String())
                                .withValueSerde(CountSum.SERDE)
                                .withRetention(retention))
                .toStream()
                .mapValues(ReadingsAverage::averageJson)
                .to(outputTopic, Produced.with(WindowedSerdes.timeWindowedSerdeFrom(String.class, windowMs),
                        Serdes.String()));
        return builder.build();
    }

    private static String averageJson(CountSum total) {
        return JSON.createObjectNode().put("AVG_READING", total.average()).toString();
    }

    /** The READING of a JSON value; null (a record the aggregation skips, as AVG skips a NULL) when absent. */
    static Long reading(byte[] value) {
        if (value == null) {
            return null;
        }
        try {
            JsonNode reading = JSON.readTree(value).get("READING");
            return reading == null || reading.isNull() ? null : reading.asLong();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** One progress line: COUNT summed over every sensor (or window) in this instance's store. */
    static void report(KafkaStreams streams, boolean windowed) {
        if (streams.state() != KafkaStreams.State.RUNNING) {
            return;
        }
        long counted = 0;
        long keys = 0;
        try (KeyValueIterator<?, CountSum> all = windowed
                ? streams.store(StoreQueryParameters.fromNameAndType(
                        STORE, QueryableStoreTypes.<String, CountSum>windowStore())).all()
                : streams.store(StoreQueryParameters.fromNameAndType(
                        STORE, QueryableStoreTypes.<String, CountSum>keyValueStore())).all()) {
            while (all.hasNext()) {
                counted += all.next().value.count();
                keys++;
            }
        } catch (InvalidStateStoreException e) {
            return; // a rebalance moved or is restoring the store: the next tick reports
        }
        emit(JSON.createObjectNode().put("counted", counted).put("keys", keys));
    }

    private static void emit(ObjectNode line) {
        System.out.println(line);
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length != 6 && args.length != 7) {
            System.err.println(
                    "usage: ReadingsAverage BOOTSTRAP TOPIC OUTPUT_TOPIC APPLICATION_ID THREADS STATE_DIR [WINDOW_MS]");
            System.exit(2);
        }
        long windowMs = args.length == 7 ? Long.parseLong(args[6]) : 0;
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[3]);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[4]));
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[5]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        // commit.interval.ms stays at its exactly-once default, 100 ms: about Millpond's
        // micro-batch trigger in the benchmark.

        KafkaStreams streams = new KafkaStreams(topology(args[1], args[2], windowMs), props);
        CountDownLatch stopped = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            emit(JSON.createObjectNode().put("state", now.name()));
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        // A failed stream thread stops the whole application rather than being replaced, so
        // the benchmark sees the failure instead of waiting for a count that never comes.
        streams.setUncaughtExceptionHandler(error -> StreamThreadExceptionResponse.SHUTDOWN_CLIENT);

        ScheduledExecutorService reporter = Executors.newSingleThreadScheduledExecutor(task -> {
            Thread thread = new Thread(task, "progress-report");
            thread.setDaemon(true);
            return thread;
        });
        reporter.scheduleAtFixedRate(() -> report(streams, windowMs > 0), REPORT_EVERY_MS, REPORT_EVERY_MS, TimeUnit.MILLISECONDS);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            reporter.shutdownNow();
            streams.close(CLOSE_TIMEOUT);
        }, "shutdown"));

        streams.start();
        stopped.await();
        if (streams.state() == KafkaStreams.State.ERROR) {
            System.exit(1);
        }
    }
}
