// Package other is a second package of the checker's test module: its doc
// names Thing, which it declares, and Vanished(), which it does not.
package other
