package transport

import "unsafe"

// eface is the layout of an interface value of type any: its dynamic type
// and a pointer to its value.
type eface struct {
	typ, data unsafe.Pointer
}

// stringType is the dynamic type of a string held in an any.
var stringType = func() unsafe.Pointer {
	var s any = ""
	return (*eface)(unsafe.Pointer(&s)).typ
}()

// keyArg returns *k as a command argument: the interface value any(*k)
// is, but referring to *k itself rather than to a copy of it. go-redis
// takes a command's arguments as []any, and converting a string to any
// copies the string's header to a new heap object: one allocation per key,
// ten per command for a batch of ten, on every acquire and release. Here
// the interface points at the header in the caller's keys slice (a lock's
// keys, which never change, or a slice made for the call), so a key costs
// nothing. To everything that reads the argument (go-redis's
// writer and its cluster routing, hooks, errors, ==) it is the string *k.
//
// *k must not change while the command may be read: until the command's
// reply has been read and, for a command abandoned by its caller, until
// the coalescer is done with it. The header is kept alive by the
// interface (the garbage collector follows pointers into a slice's array).
func keyArg(k *string) any {
	var a any
	e := (*eface)(unsafe.Pointer(&a))
	e.typ, e.data = stringType, unsafe.Pointer(k)
	return a
}
