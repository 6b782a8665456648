// Single translation unit of the extension: the torch headers dominate build time (about
// ten seconds each time they are parsed), so the parts are compiled together.
#include "runtime.cpp"   // NOLINT(bugprone-suspicious-include)
#include "kernels.cpp"   // NOLINT(bugprone-suspicious-include)
#include "fallback.cpp"  // NOLINT(bugprone-suspicious-include)
#include "rnn.cpp"       // NOLINT(bugprone-suspicious-include)
#include "autocast.cpp"  // NOLINT(bugprone-suspicious-include)
#include "shallow_copy.cpp"  // NOLINT(bugprone-suspicious-include)
