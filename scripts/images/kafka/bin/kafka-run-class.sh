#!/bin/bash
# kafka-run-class.sh CLASS ARGS...: a Kafka tool on the image's classpath,
# as the distribution's script does (short-lived JVM, problems on stderr).
# shellcheck disable=SC2086 # KAFKA_HEAP_OPTS is a list of JVM flags
exec java ${KAFKA_HEAP_OPTS:--Xmx256m} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true \
	-Dlog4j2.configurationFile=/opt/kafka/config/tools-log4j2.properties \
	-cp '/opt/kafka/libs/*' "$@"
