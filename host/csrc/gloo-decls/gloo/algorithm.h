#pragma once
// Declarations only: see ../README.md.
#include "gloo/context.h"
