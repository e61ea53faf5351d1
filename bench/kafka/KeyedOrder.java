import java.io.BufferedWriter;
import java.io.FileWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The keyed workload of bench/rescale.py against Kafka: one producer sends key-i with the values
 * 0, 1, 2, ... of each key, open loop at RATE1 msg/s for SECONDS1, then at RATE2 for SECONDS2; one
 * consumer (its own group, from the earliest offset) reads concurrently until it has every
 * acknowledged record or DRAIN seconds pass after the producer stops.
 *
 * <p>Every acknowledgement ("A key value partition offset ms") and every delivery ("C key value
 * partition offset ms", in the order the consumer saw them) goes to OUT; the Python side checks
 * per-key order with the chaos checker. On stdout: "START", "CHANGE ms" at the rate change (the
 * orchestrator then adds partitions, or not), "T ms sent acked consumed" every second, "DONE".
 *
 * <p>Run with Java's source launcher: java -cp 'lib/*' KeyedOrder.java BOOTSTRAP TOPIC KEYS RATE1
 * SECONDS1 RATE2 SECONDS2 PAYLOAD OUT DRAIN
 */
public class KeyedOrder {
  public static void main(String[] a) throws Exception {
    String bootstrap = a[0];
    String topic = a[1];
    int keys = Integer.parseInt(a[2]);
    double rate1 = Double.parseDouble(a[3]);
    double seconds1 = Double.parseDouble(a[4]);
    double rate2 = Double.parseDouble(a[5]);
    double seconds2 = Double.parseDouble(a[6]);
    int payload = Integer.parseInt(a[7]);
    PrintWriter out = new PrintWriter(new BufferedWriter(new FileWriter(a[8]), 1 << 20));
    double drain = Double.parseDouble(a[9]);

    AtomicLong t0 = new AtomicLong(System.nanoTime());
    CountDownLatch assigned = new CountDownLatch(1);
    AtomicLong acked = new AtomicLong();
    AtomicLong failed = new AtomicLong();
    AtomicLong consumed = new AtomicLong();
    AtomicBoolean producing = new AtomicBoolean(true);
    Set<String> seen = new HashSet<>();

    Properties cp = new Properties();
    cp.put("bootstrap.servers", bootstrap);
    cp.put("group.id", "keyed-order-" + UUID.randomUUID());
    cp.put("auto.offset.reset", "earliest");
    cp.put("enable.auto.commit", "false");
    cp.put("metadata.max.age.ms", "1000");
    cp.put("key.deserializer", StringDeserializer.class.getName());
    cp.put("value.deserializer", ByteArrayDeserializer.class.getName());
    Thread reader =
        new Thread(
            () -> {
              try (KafkaConsumer<String, byte[]> consumer = new KafkaConsumer<>(cp)) {
                consumer.subscribe(List.of(topic));
                long drainUntil = Long.MAX_VALUE;
                while (true) {
                  ConsumerRecords<String, byte[]> records = consumer.poll(Duration.ofMillis(100));
                  if (!consumer.assignment().isEmpty()) {
                    assigned.countDown();
                  }
                  long now = ms(t0.get());
                  for (ConsumerRecord<String, byte[]> r : records) {
                    String value = new String(r.value(), StandardCharsets.US_ASCII).trim();
                    synchronized (out) {
                      out.println(
                          "C " + r.key() + " " + value + " " + r.partition() + " " + r.offset()
                              + " " + now);
                      seen.add(r.key() + " " + value);
                    }
                    consumed.incrementAndGet();
                  }
                  if (!records.isEmpty()) {
                    consumer.commitAsync();
                  }
                  if (!producing.get()) {
                    if (drainUntil == Long.MAX_VALUE) {
                      drainUntil = now + (long) (drain * 1000);
                    }
                    int distinct;
                    synchronized (out) {
                      distinct = seen.size();
                    }
                    if (distinct >= acked.get() || now > drainUntil) {
                      return;
                    }
                  }
                }
              }
            });
    reader.start();

    Properties pp = new Properties();
    pp.put("bootstrap.servers", bootstrap);
    pp.put("acks", "all");
    pp.put("linger.ms", "1");
    pp.put("batch.size", "131072");
    pp.put("metadata.max.age.ms", "1000");
    pp.put("key.serializer", StringSerializer.class.getName());
    pp.put("value.serializer", ByteArraySerializer.class.getName());
    long[] next = new long[keys];
    long sent = 0;
    try (KafkaProducer<String, byte[]> producer = new KafkaProducer<>(pp)) {
      // The clock starts once both clients are connected: the producer has the topic's metadata
      // and the consumer its partitions (the first group of a cluster also creates
      // __consumer_offsets, which takes seconds).
      producer.partitionsFor(topic);
      if (!assigned.await(120, TimeUnit.SECONDS)) {
        throw new IllegalStateException("the consumer got no partitions in 120 s");
      }
      t0.set(System.nanoTime());
      System.out.println("START");
      System.out.flush();
      boolean changed = false;
      long lastReport = 0;
      while (true) {
        double t = (System.nanoTime() - t0.get()) / 1e9;
        if (t >= seconds1 + seconds2) {
          break;
        }
        if (!changed && t >= seconds1) {
          changed = true;
          System.out.println("CHANGE " + ms(t0.get()));
          System.out.flush();
        }
        long due =
            (long) (rate1 * Math.min(t, seconds1) + rate2 * Math.max(0.0, t - seconds1));
        while (sent < due) {
          int k = (int) (sent % keys);
          long v = next[k]++;
          String key = "key-" + k;
          producer.send(
              new ProducerRecord<>(topic, key, encode(v, payload)),
              (md, e) -> {
                long now = ms(t0.get());
                synchronized (out) {
                  if (e != null) {
                    failed.incrementAndGet();
                    out.println("F " + key + " " + v + " " + now);
                  } else {
                    acked.incrementAndGet();
                    out.println(
                        "A " + key + " " + v + " " + md.partition() + " " + md.offset() + " "
                            + now);
                  }
                }
              });
          sent++;
        }
        long now = ms(t0.get());
        if (now - lastReport >= 1000) {
          lastReport = now;
          System.out.println("T " + now + " " + sent + " " + acked.get() + " " + consumed.get());
          System.out.flush();
        }
        Thread.sleep(1);
      }
      producer.flush();
    }
    producing.set(false);
    reader.join();
    synchronized (out) {
      out.flush();
      out.close();
    }
    System.out.println(
        "DONE " + sent + " " + acked.get() + " " + failed.get() + " " + consumed.get());
    System.out.flush();
  }

  private static long ms(long t0) {
    return (System.nanoTime() - t0) / 1_000_000;
  }

  private static byte[] encode(long value, int size) {
    byte[] digits = Long.toString(value).getBytes(StandardCharsets.US_ASCII);
    byte[] out = new byte[Math.max(size, digits.length)];
    Arrays.fill(out, (byte) ' ');
    System.arraycopy(digits, 0, out, 0, digits.length);
    return out;
  }
}
