// kiln::templates in one include: the template engine, the registry and its grids, epilogues, kernel
// argument structs, launch helpers and subgraphs.
#pragma once

#include "kiln/templates/epilogue.h"
#include "kiln/templates/kernel_args.h"
#include "kiln/templates/launch.h"
#include "kiln/templates/registry.h"
#include "kiln/templates/template.h"
