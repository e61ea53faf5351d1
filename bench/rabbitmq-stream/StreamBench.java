// StreamBench drives a RabbitMQ stream with the project's own Java stream client, the way its
// stream-perf-test does: a producer with a bounded window of unconfirmed messages (send blocks
// when it is full) and publisher confirms, and a consumer reading the stream from its start.
// It prints one JSON object on stdout; bench/_native.py parses it. Run as a single-file source
// program on the client's jars (bench/_rabbitmq.py resolves them with Maven):
//
//	java -cp 'LIB/*' StreamBench.java -port P -stream S -mode reset
//	java -cp 'LIB/*' StreamBench.java -port P -stream S -mode produce -payload 1024 -duration 2 -warmup 0.5 -window 4096
//	java -cp 'LIB/*' StreamBench.java -port P -stream S -mode consume -duration 2
import com.rabbitmq.stream.ConfirmationStatus;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import com.rabbitmq.stream.Constants;
import com.rabbitmq.stream.StreamException;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

public class StreamBench {
  static final int MAX_SAMPLES = 20_000_000;

  public static void main(String[] argv) throws Exception {
    Map<String, String> a = new HashMap<>();
    for (int i = 0; i + 1 < argv.length; i += 2) {
      a.put(argv[i].replaceFirst("^-+", ""), argv[i + 1]);
    }
    String host = a.getOrDefault("host", "127.0.0.1");
    int port = Integer.parseInt(a.getOrDefault("port", "5552"));
    String stream = a.getOrDefault("stream", "bench");
    String mode = a.getOrDefault("mode", "produce");
    try (Environment env = Environment.builder().host(host).port(port).build()) {
      String out;
      switch (mode) {
        case "reset" -> out = reset(env, stream);
        case "produce" -> out = produce(env, stream,
            Integer.parseInt(a.getOrDefault("payload", "1024")),
            Integer.parseInt(a.getOrDefault("window", "4096")),
            secs(a.getOrDefault("warmup", "0.5")),
            secs(a.getOrDefault("duration", "2")));
        case "consume" -> out = consume(env, stream, secs(a.getOrDefault("duration", "2")));
        default -> throw new IllegalArgumentException("unknown -mode " + mode);
      }
      System.out.println(out);
    }
    System.exit(0);  // the client's Netty threads would otherwise keep the JVM up a while
  }

  static long secs(String s) {
    return (long) (Double.parseDouble(s) * 1e9);
  }

  static String reset(Environment env, String stream) {
    try {
      env.deleteStream(stream);
    } catch (StreamException e) {
      if (e.getCode() != Constants.RESPONSE_CODE_STREAM_DOES_NOT_EXIST) {
        throw e;
      }
    }
    env.streamCreator().stream(stream).create();
    return "{\"stream\":\"" + stream + "\"}";
  }

  // produce keeps the window full for warm-up + duration: send() blocks while `window` messages
  // are unconfirmed. Each message carries its send time (System.nanoTime) in its first 8 bytes,
  // so the confirmation handler records publish->confirm latency of the messages sent after the
  // warm-up without a lookup table.
  static String produce(Environment env, String stream, int size, int window, long warmup,
      long duration) throws InterruptedException {
    int[] latUs = new int[MAX_SAMPLES];
    AtomicInteger samples = new AtomicInteger();
    AtomicLong acked = new AtomicLong();
    AtomicLong errors = new AtomicLong();
    AtomicLong lastAck = new AtomicLong();
    Semaphore unconfirmed = new Semaphore(window);
    AtomicReference<String> first = new AtomicReference<>("");
    long start = System.nanoTime();
    long measureFrom = start + warmup;
    long stop = measureFrom + duration;
    Producer producer = env.producerBuilder().stream(stream).maxUnconfirmedMessages(window)
        .build();
    long sent = 0;
    byte[] template = new byte[Math.max(size, 8)];
    new java.util.Random(1).nextBytes(template);
    while (true) {
      long now = System.nanoTime();
      if (now >= stop) {
        break;
      }
      byte[] body = template.clone();
      ByteBuffer.wrap(body).putLong(now);
      unconfirmed.acquire();
      producer.send(producer.messageBuilder().addData(body).build(), (ConfirmationStatus st) -> {
        long at = System.nanoTime();
        long sentAt = ByteBuffer.wrap(st.getMessage().getBodyAsBinary()).getLong();
        if (!st.isConfirmed()) {
          errors.incrementAndGet();
          first.compareAndSet("", "code " + st.getCode());
        } else if (sentAt >= measureFrom) {
          acked.incrementAndGet();
          lastAck.accumulateAndGet(at, Math::max);
          int i = samples.getAndIncrement();
          if (i < MAX_SAMPLES) {
            latUs[i] = (int) Math.min(Integer.MAX_VALUE, (at - sentAt) / 1000);
          }
        }
        unconfirmed.release();
      });
      if (now >= measureFrom) {
        sent++;
      }
    }
    unconfirmed.tryAcquire(window, 30, TimeUnit.SECONDS);  // every confirmation is in
    producer.close();
    double seconds = (lastAck.get() - measureFrom) / 1e9;
    if (seconds <= 0) {
      seconds = duration / 1e9;
    }
    int n = Math.min(samples.get(), MAX_SAMPLES);
    int[] lat = Arrays.copyOf(latUs, n);
    Arrays.sort(lat);
    double p50 = 0, p99 = 0, p999 = 0, max = 0, mean = 0;
    if (n > 0) {
      p50 = lat[Math.min(n - 1, (int) (0.5 * n))] / 1000.0;
      p99 = lat[Math.min(n - 1, (int) (0.99 * n))] / 1000.0;
      p999 = lat[Math.min(n - 1, (int) (0.999 * n))] / 1000.0;
      max = lat[n - 1] / 1000.0;
      long sum = 0;
      for (int v : lat) {
        sum += v;
      }
      mean = sum / 1000.0 / n;
    }
    return String.format(Locale.ROOT,
        "{\"sent\":%d,\"acked\":%d,\"errors\":%d,\"seconds\":%.6f,\"rate\":%.1f,"
            + "\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"p999_ms\":%.3f,\"max_ms\":%.3f,\"mean_ms\":%.3f,"
            + "\"samples\":%d,\"first_error\":\"%s\"}",
        sent, acked.get(), errors.get(), seconds, acked.get() / seconds, p50, p99, p999, max,
        mean, n, first.get());
  }

  // consume reads the stream from its first offset until it has been idle for a second (drained)
  // or the duration is up; the client's credit-based flow control keeps chunks coming.
  static String consume(Environment env, String stream, long duration)
      throws InterruptedException {
    AtomicLong received = new AtomicLong();
    AtomicLong last = new AtomicLong();
    long start = System.nanoTime();
    last.set(start);
    Consumer consumer = env.consumerBuilder().stream(stream).offset(OffsetSpecification.first())
        .messageHandler((ctx, msg) -> {
          received.incrementAndGet();
          last.set(System.nanoTime());
        }).build();
    long deadline = start + duration;
    while (System.nanoTime() < deadline) {
      Thread.sleep(20);
      if (System.nanoTime() - last.get() > TimeUnit.SECONDS.toNanos(1)) {
        break;
      }
    }
    consumer.close();
    double seconds = (last.get() - start) / 1e9;
    double rate = seconds > 0 ? received.get() / seconds : 0.0;
    return String.format(Locale.ROOT, "{\"received\":%d,\"seconds\":%.6f,\"rate\":%.1f}",
        received.get(), seconds, rate);
  }
}
