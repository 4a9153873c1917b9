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
	var opts []cel.EnvOption
	for _, n := range Names {
		opts = append(opts, cel.Variable(n, cel.IntType))
	}
	env, err := cel.NewEnv(opts...)
	if err != nil {
		return nil, err
	}
	ast, iss := env.Compile(Expr)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	return env.Program(ast)
}

// Names are the expression's variables, in the order of Vars.
var Names = [...]string{"input", "output", "cached", "a", "b", "c"}

// Vars is one evaluation's variables, in the order of Names: an
// Activation without a map, CEL's cheapest way in.
type Vars [len(Names)]int64

// ResolveName implements interpreter.Activation.
func (v *Vars) ResolveName(name string) (any, bool) {
	for i, n := range Names {
		if n == name {
			return types.Int(v[i]), true
		}
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
