package org.apache.spark.sql.catalyst.json;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.Reader;
import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.nio.charset.StandardCharsets;
import org.apache.hadoop.io.Text;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.CharsetProvider$;
import org.apache.spark.unsafe.types.UTF8String;
import scala.runtime.ModuleSerializationProxy;

/**
 * Spark's {@code CreateJacksonParser} (spark-catalyst 4.2.0), the Scala object's class, with
 * one change: {@code utf8String}, which {@code from_json} calls for every record, decodes the
 * record's UTF-8 into a String and parses that, instead of parsing through an
 * InputStreamReader. The reader's decoder allocates an 8 KB buffer per record: 1.0-1.3 us of a
 * 40-byte record's parse against 0.15 us (Jackson 2.21, JDK 17), and in bench.aggregation a
 * third of the Spark task thread's samples. Both decode the same way, a malformed byte
 * sequence becoming U+FFFD, so every record parses to what it did. The other methods are
 * Spark's, line for line.
 *
 * <p>The extension's jar comes first on a local master's class path (see
 * {@code millpond.services.worker.spark}), so this class is the one loaded there; a cluster's
 * executors load Spark's own, which gives the same results. tests/unit/services/worker/test_spark.py
 * checks that this class has each of Spark's methods and reads values as Spark's does.
 */
public final class CreateJacksonParser$ implements Serializable {
  private static final long serialVersionUID = 1L;

  public static final CreateJacksonParser$ MODULE$ = new CreateJacksonParser$();

  private CreateJacksonParser$() {}

  public JsonParser string(JsonFactory jsonFactory, String record) throws IOException {
    return jsonFactory.createParser(record);
  }

  public JsonParser utf8String(JsonFactory jsonFactory, UTF8String record) throws IOException {
    ByteBuffer bb = record.getByteBuffer();
    if (!bb.hasArray()) { // Scala's assert, which is always on
      throw new AssertionError("assertion failed");
    }
    String text = new String(bb.array(), bb.arrayOffset() + bb.position(), bb.remaining(), StandardCharsets.UTF_8);
    return jsonFactory.createParser(text);
  }

  public JsonParser text(JsonFactory jsonFactory, Text record) throws IOException {
    return jsonFactory.createParser(record.getBytes(), 0, record.getLength());
  }

  private Reader getStreamDecoder(String enc, byte[] in, int length) {
    ByteArrayInputStream bais = new ByteArrayInputStream(in, 0, length);
    CharsetProvider$ charsets = CharsetProvider$.MODULE$;
    return Channels.newReader(Channels.newChannel(bais),
        charsets.newDecoder(enc, charsets.newDecoder$default$2(), charsets.newDecoder$default$3(), "Jackson Parser"),
        Math.min(length, 8192));
  }

  public JsonParser text(String enc, JsonFactory jsonFactory, Text record) throws IOException {
    return jsonFactory.createParser(getStreamDecoder(enc, record.getBytes(), record.getLength()));
  }

  public JsonParser inputStream(JsonFactory jsonFactory, InputStream is) throws IOException {
    return jsonFactory.createParser(is);
  }

  public JsonParser inputStream(String enc, JsonFactory jsonFactory, InputStream is) throws IOException {
    return jsonFactory.createParser(new InputStreamReader(is, enc));
  }

  public JsonParser internalRow(JsonFactory jsonFactory, InternalRow row) throws IOException {
    byte[] ba = row.getBinary(0);
    return jsonFactory.createParser(ba, 0, ba.length);
  }

  public JsonParser internalRow(String enc, JsonFactory jsonFactory, InternalRow row) throws IOException {
    byte[] binary = row.getBinary(0);
    return jsonFactory.createParser(getStreamDecoder(enc, binary, binary.length));
  }

  private Object writeReplace() {
    return new ModuleSerializationProxy(CreateJacksonParser$.class);
  }
}
