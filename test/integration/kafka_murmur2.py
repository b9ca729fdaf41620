# The partition Kafka's Java client gives a keyed record: the positive part of
# murmur2 over the key's bytes, modulo the partition count
# (org.apache.kafka.common.utils.Utils.murmur2 and BuiltInPartitioner). Written
# from the Java source, not from librdkafka, so that a test comparing
# relaybus's placement with it checks librdkafka's partitioner too;
# kafka_partitions.sh checks it against the Java client itself.
M32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & M32
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & M32
        k ^= k >> r
        k = (k * m) & M32
        h = (h * m) & M32
        h ^= k
    tail = data[length - length % 4:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if len(tail) >= 1:
        h ^= tail[0]
        h = (h * m) & M32
    h ^= h >> 13
    h = (h * m) & M32
    h ^= h >> 15
    return h


def java_partition(key: str, partitions: int) -> int:
    return (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % partitions
