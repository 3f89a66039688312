package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
)

// envPrefix starts the environment variable that stands for each flag:
// CHIME_ and the flag's name in capitals with '-' as '_' (--kafka-brokers
// is CHIME_KAFKA_BROKERS). Containers and systemd units configure chimed
// through them, so that a node needs no long command line.
const envPrefix = "CHIME_"

// otherEnv are the CHIME_ variables that are not flags: chimed reads the
// Kafka SASL password from one (a flag would show it in ps), and chimectl
// reads its address and token from the others, which a container running
// both may well set.
var otherEnv = []string{"CHIME_KAFKA_SASL_PASSWORD", "CHIME_ADDR", "CHIME_TOKEN"}

// envName is the variable that stands for flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// setFromEnv gives every flag of fs that the command line did not set the
// value of its variable, when that is set: the command line wins. A
// repeatable flag (--allow-topic) takes a comma-separated list. A value the
// flag refuses is an error naming the variable. It returns the CHIME_
// variables that name no flag of fs, so that a misspelt one is reported
// rather than silently ignored.
func setFromEnv(fs *flag.FlagSet, repeatable []string, environ []string) (unknown []string, err error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	byEnv := map[string]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) { byEnv[envName(f.Name)] = f })
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, envPrefix) {
			continue
		}
		f := byEnv[name]
		if f == nil {
			if !slices.Contains(otherEnv, name) {
				unknown = append(unknown, name)
			}
			continue
		}
		if given[f.Name] {
			continue
		}
		values := []string{value}
		if slices.Contains(repeatable, f.Name) {
			values = strings.Split(value, ",")
		}
		for _, v := range values {
			if err := fs.Set(f.Name, strings.TrimSpace(v)); err != nil {
				return nil, fmt.Errorf("%s=%q: invalid value for --%s: %v", name, value, f.Name, err)
			}
		}
	}
	slices.Sort(unknown)
	return unknown, nil
}

// envHelp is the line the usage of a command that reads its flags from the
// environment ends its flag list with.
func envHelp() string {
	return "\nEvery flag can also be set by an environment variable: CHIME_ and the flag's name in capitals\n" +
		"with - as _ (--kafka-brokers is CHIME_KAFKA_BROKERS, --insecure is CHIME_INSECURE=true;\n" +
		"--allow-topic takes a comma-separated list). A flag given on the command line wins.\n"
}
