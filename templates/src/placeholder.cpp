// Placeholder translation unit: kiln::templates has no code yet (see its CMakeLists.txt).
namespace kiln::templates_placeholder {
int unused = 0;
}
