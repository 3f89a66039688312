// Package kafkaflag is the --kafka-tls* and --kafka-sasl-* flags that chimed
// (serve, dev) and chimectl (tail, bench) share, and the publish.Security
// they build: how Chime's producer and chimectl's consumers reach a Kafka
// that demands TLS, SASL or both.
//
// # What it owns
//
//   - The flags' names, help and rules, in one place so that the two
//     commands cannot drift apart:
//
//     --kafka-tls                     TLS, verified against the system's roots
//     --kafka-tls-ca FILE             PEM CA bundle trusted instead; implies --kafka-tls
//     --kafka-tls-cert FILE           PEM client certificate; implies --kafka-tls
//     --kafka-tls-key FILE            its PEM private key (both or neither)
//     --kafka-sasl-mechanism NAME     PLAIN or SCRAM-SHA-512 (any case)
//     --kafka-sasl-user NAME          required with a mechanism
//     --kafka-sasl-password-file FILE the password (one trailing newline dropped)
//
//     Without --kafka-sasl-password-file the password is the environment
//     variable CHIME_KAFKA_SASL_PASSWORD ([PasswordEnv]). There is no
//     password flag: a command line shows in ps and in shell history.
//
//   - Loading what they name: the CA bundle, the client key pair and the
//     password file, each read once, when [Flags.Security] is called.
//
// # What it must never do
//
//   - Put the password in an error, a log line or a String: errors name
//     the flag, the file and the rule, never a secret.
//   - Exit, print or read the environment itself: the caller passes getenv
//     and decides what an error does (both commands exit 2 naming it).
//   - Know a Kafka client: it returns publish.Security, which publish
//     applies to kafka-go and chimectl to franz-go.
package kafkaflag
