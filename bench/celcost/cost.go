package celcost

import (
	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/interpreter"
)

// Expr is the weighted cost as a CEL expression.
const Expr = "input * a + output * b + cached * c"

// Compile compiles Expr once, as a filter would at configuration time.
func Compile() (cel.Program, error) {
	env, err := cel.NewEnv(
		cel.Variable("input", cel.IntType), cel.Variable("output", cel.IntType), cel.Variable("cached", cel.IntType),
		cel.Variable("a", cel.IntType), cel.Variable("b", cel.IntType), cel.Variable("c", cel.IntType),
	)
	if err != nil {
		return nil, err
	}
	ast, iss := env.Compile(Expr)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	return env.Program(ast)
}

// Vars is one evaluation's variables: an Activation without a map, CEL's
// cheapest way in.
type Vars struct {
	Input, Output, Cached, A, B, C int64
}

// ResolveName implements interpreter.Activation.
func (v *Vars) ResolveName(name string) (any, bool) {
	switch name {
	case "input":
		return types.Int(v.Input), true
	case "output":
		return types.Int(v.Output), true
	case "cached":
		return types.Int(v.Cached), true
	case "a":
		return types.Int(v.A), true
	case "b":
		return types.Int(v.B), true
	case "c":
		return types.Int(v.C), true
	}
	return nil, false
}

// Parent implements interpreter.Activation.
func (v *Vars) Parent() interpreter.Activation { return nil }

var _ interpreter.Activation = (*Vars)(nil)

// Eval evaluates prg with v; -1 on an error (an overflow: CEL's ints are
// checked).
func Eval(prg cel.Program, v *Vars) int64 {
	out, _, err := prg.Eval(v)
	if err != nil {
		return -1
	}
	return int64(out.(types.Int))
}
