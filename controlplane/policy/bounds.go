package policy

// maxNodes caps the YAML nodes visited, counting every alias expansion, so
// that a small document of nested aliases cannot make parsing explode. (A
// variable so that tests can lower it.)
var maxNodes = 1 << 20
