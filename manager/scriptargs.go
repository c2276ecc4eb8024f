package manager

import (
	"strconv"
	"time"
)

// formatMs is a duration as a script's argument in milliseconds.
func formatMs(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// luaFlag is a script's boolean argument: "1" or "0".
func luaFlag(on bool) string {
	if on {
		return "1"
	}
	return "0"
}

// Script arguments boxed once: a string put into an interface anew costs
// an allocation on every call.
var (
	luaTrue  any = "1"
	luaFalse any = "0"
)

// luaArg is luaFlag(on) as a script argument.
func luaArg(on bool) any {
	if on {
		return luaTrue
	}
	return luaFalse
}
