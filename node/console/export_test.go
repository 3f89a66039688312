package console

// DeferCount makes the events page leave its count to the script whatever
// its speed (a test cluster's count is always in time), until restore.
func DeferCount() (restore func()) {
	old := countWait.Swap(-1)
	return func() { countWait.Store(old) }
}
